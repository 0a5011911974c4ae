// Package board is npuboard's: a read-only web page of the lab's boxes —
// who holds which device, the line, utilization and the last day as a
// timeline — drawn from the local broker, asked as any user asks, and
// from the other boxes' npuboards.
package board

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/npurun/npurun/board/fetch"
	"github.com/npurun/npurun/cmd/npubroker/cli"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/wire"
)

// npuboard serves, read-only:
//
//	/             the page: one panel per box (this one first, then the
//	              peers in the configuration's order), server-rendered,
//	              usable without JavaScript; ?part=boxes is the panels
//	              alone, which static/board.js fetches every refresh
//	/api/status   the broker's board, as npubroker status --json prints it
//	/api/history  ?since=24h (at most 7d): who held which device when
//	/api/usage    ?since=7d: device-hours per user, as npubroker usage --json
//	/api/box      this box's data for its peers' pages: the board, a
//	              day's history, a week's usage, the last hour's
//	              utilization samples (never its own peers')
//	/static/…     the script and the style sheet
//
// Every answer carries a Content-Security-Policy that allows scripts and
// styles from npuboard alone (no inline script, no inline style), and
// X-Content-Type-Options: nosniff. Peers' data is parsed into the same
// types as the local broker's and drawn by the same template: a peer's
// string never becomes HTML unescaped.

// Config is what npuboard serves from.
type Config struct {
	Socket  string        // the broker's socket
	Host    string        // this box's name on the page ("" : the host name)
	Refresh time.Duration // how often the page refreshes and data is fetched anew
	Peers   []string      // the other boxes' npuboards
	// PeerTimeout and PeerMax bound each fetch from a peer (0: the
	// defaults).
	PeerTimeout time.Duration
	PeerMax     int64
	Log         *log.Logger
}

// Defaults of the peers' fetches.
const (
	DefaultPeerTimeout = fetch.DefaultTimeout
	DefaultPeerMax     = fetch.DefaultMax
)

// CSP is the Content-Security-Policy of every answer.
const CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Bounds of a request's query.
const (
	DefaultHistorySince = 24 * time.Hour
	DefaultUsageSince   = 7 * 24 * time.Hour
	sparkSpan           = time.Hour // the sparklines' span
)

//go:embed templates/page.html static
var files embed.FS

// Server is npuboard.
type Server struct {
	cfg   Config
	mux   *http.ServeMux
	peers []*peer

	mu    sync.Mutex       // guards what follows
	local *localCache      // this box's data, fresh for one refresh
	util  *utilRing        // the utilization samples of the last hour
	idle  map[uint64][]Gap // idle stretches seen per lease, for the timeline's hatches
	fetch chan struct{}    // one fetch of the local data at a time
}

// New makes npuboard's server.
func New(cfg Config) *Server {
	if cfg.Refresh <= 0 {
		cfg.Refresh = 5 * time.Second
	}
	if cfg.PeerTimeout <= 0 {
		cfg.PeerTimeout = DefaultPeerTimeout
	}
	if cfg.PeerMax <= 0 {
		cfg.PeerMax = DefaultPeerMax
	}
	if cfg.Host == "" {
		cfg.Host, _ = os.Hostname()
	}
	if cfg.Log == nil {
		cfg.Log = log.New(os.Stderr, "npuboard: ", 0)
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), util: newUtilRing(sparkSpan), idle: map[uint64][]Gap{}, fetch: make(chan struct{}, 1)}
	client := fetch.Client(cfg.PeerTimeout)
	for _, u := range cfg.Peers {
		s.peers = append(s.peers, &peer{url: strings.TrimSuffix(u, "/"), client: client, max: cfg.PeerMax, timeout: cfg.PeerTimeout, refresh: cfg.Refresh})
	}
	static, _ := fs.Sub(files, "static")
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /{$}", s.page)
	s.mux.HandleFunc("GET /api/status", s.apiStatus)
	s.mux.HandleFunc("GET /api/history", s.apiHistory)
	s.mux.HandleFunc("GET /api/usage", s.apiUsage)
	s.mux.HandleFunc("GET /api/box", s.apiBox)
	return s
}

// ServeHTTP serves a request, with the headers every answer carries.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "npuboard is read-only", http.StatusMethodNotAllowed)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Run samples the local broker every refresh, for the sparklines and the
// idle stretches, until ctx ends.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Refresh)
	defer t.Stop()
	for {
		s.localData(true)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ask runs f on a fresh connection to the broker.
func (s *Server) ask(f func(c *wire.Conn) error) error {
	c, err := wire.Dial(s.cfg.Socket)
	if err != nil {
		return err
	}
	defer c.Close()
	return f(c)
}

func (s *Server) status() (*wire.Board, error) {
	var b *wire.Board
	err := s.ask(func(c *wire.Conn) (err error) { b, err = c.Status(); return })
	return b, err
}

func (s *Server) history(since time.Duration) (*wire.HistoryReport, error) {
	var h *wire.HistoryReport
	err := s.ask(func(c *wire.Conn) (err error) {
		h, err = c.LeaseHistory(wire.HistoryQuery{SinceMS: time.Now().Add(-since).UnixMilli()})
		return
	})
	return h, err
}

func (s *Server) usage(since time.Duration) (*wire.UsageReport, error) {
	var u *wire.UsageReport
	err := s.ask(func(c *wire.Conn) (err error) {
		u, err = c.Usage(wire.UsageQuery{SinceMS: time.Now().Add(-since).UnixMilli()})
		return
	})
	return u, err
}

// localCache is this box's data as last fetched.
type localCache struct {
	at  time.Time
	box *Box
}

// localData is this box's data, fetched anew where it is older than a
// refresh (or force); one fetch at a time, the others wait for it.
func (s *Server) localData(force bool) *Box {
	s.fetch <- struct{}{}
	defer func() { <-s.fetch }()
	s.mu.Lock()
	lc := s.local
	s.mu.Unlock()
	if lc != nil && !force && time.Since(lc.at) < s.cfg.Refresh {
		return lc.box
	}
	now := time.Now()
	box := &Box{Name: s.cfg.Host, Local: true, Fetched: now.UnixMilli()}
	var err error
	if box.Status, err = s.status(); err == nil {
		box.History, err = s.history(DefaultHistorySince)
	}
	if err == nil {
		box.Usage, err = s.usage(DefaultUsageSince)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		box.Status, box.History, box.Usage = nil, nil, nil
		box.Down = err.Error()
		box.DownSince = now.UnixMilli()
		if lc != nil && lc.box.Down != "" {
			box.DownSince = lc.box.DownSince
		}
	} else {
		intern(box)
		s.noteLocked(box.Status)
	}
	box.Util = s.util.series()
	box.Idle = s.idleLocked(box.History)
	s.local = &localCache{at: now, box: box}
	return box
}

// noteLocked keeps what a board says for the sparklines (each device's
// utilization) and the timeline (each lease's idle stretch).
func (s *Server) noteLocked(b *wire.Board) {
	at := time.UnixMilli(b.Time)
	s.util.add(at, b.Devices)
	for _, d := range b.Devices {
		leases := d.Shares
		if d.Lease != nil && len(d.Shares) == 0 {
			leases = []wire.LeaseInfo{*d.Lease}
		}
		for _, l := range leases {
			if l.IdleSince == 0 {
				continue
			}
			gaps := s.idle[l.ID]
			if n := len(gaps); n > 0 && gaps[n-1].From == l.IdleSince {
				gaps[n-1].To = b.Time
			} else if len(gaps) < 64 {
				gaps = append(gaps, Gap{From: l.IdleSince, To: b.Time})
			}
			s.idle[l.ID] = gaps
		}
	}
	cut := at.Add(-DefaultHistorySince).UnixMilli()
	for id, gaps := range s.idle {
		if gaps[len(gaps)-1].To < cut {
			delete(s.idle, id)
		}
	}
}

// idleLocked is the idle stretches seen of the leases of h.
func (s *Server) idleLocked(h *wire.HistoryReport) map[uint64][]Gap {
	out := map[uint64][]Gap{}
	if h == nil {
		return out
	}
	for _, e := range h.Entries {
		if g := s.idle[e.Lease]; len(g) > 0 {
			out[e.Lease] = g
		}
	}
	return out
}

// Gap is a stretch of time, Unix ms.
type Gap struct {
	From int64 `json:"from"`
	To   int64 `json:"to"`
}

// Sample is a device's utilization at a time (Unix ms); U < 0: unknown.
type Sample struct {
	T int64   `json:"t"`
	U float64 `json:"u"`
}

// Box is one box's data, this one's or a peer's: what /api/box serves
// and the page draws.
type Box struct {
	Name    string              `json:"host"`
	Local   bool                `json:"-"`
	URL     string              `json:"-"` // a peer's
	Fetched int64               `json:"fetched"`
	Status  *wire.Board         `json:"status"`
	History *wire.HistoryReport `json:"history"`
	Usage   *wire.UsageReport   `json:"usage"`
	Util    map[string][]Sample `json:"util"` // by device id
	Idle    map[uint64][]Gap    `json:"idle"` // by lease id
	// Down says why the box did not answer, and since when (Unix ms).
	Down      string `json:"-"`
	DownSince int64  `json:"-"`
}

func (s *Server) apiStatus(w http.ResponseWriter, r *http.Request) {
	b, err := s.status()
	if err != nil {
		s.brokerDown(w, err)
		return
	}
	s.writeJSON(w, b, true)
}

func (s *Server) apiHistory(w http.ResponseWriter, r *http.Request) {
	since, ok := sinceParam(w, r, DefaultHistorySince, wire.MaxHistorySpan)
	if !ok {
		return
	}
	h, err := s.history(since)
	if err != nil {
		s.brokerDown(w, err)
		return
	}
	s.writeJSON(w, h, true)
}

func (s *Server) apiUsage(w http.ResponseWriter, r *http.Request) {
	since, ok := sinceParam(w, r, DefaultUsageSince, 366*quantity.Day)
	if !ok {
		return
	}
	u, err := s.usage(since)
	if err != nil {
		s.brokerDown(w, err)
		return
	}
	s.writeJSON(w, u, true)
}

func (s *Server) apiBox(w http.ResponseWriter, r *http.Request) {
	box := s.localData(false)
	if box.Down != "" {
		s.brokerDown(w, errors.New(box.Down))
		return
	}
	s.writeJSON(w, box, false) // for peers: compact, a day of history is large
}

// sinceParam reads ?since= (24h, 7d, 90m), at most most.
func sinceParam(w http.ResponseWriter, r *http.Request, def, most time.Duration) (time.Duration, bool) {
	v := r.URL.Query().Get("since")
	if v == "" {
		return def, true
	}
	d, err := quantity.ParseDuration(v)
	if err != nil || d <= 0 || d > most {
		http.Error(w, fmt.Sprintf("bad since %q: want a duration such as 24h or 7d, at most %s", v, quantity.Duration(most)), http.StatusBadRequest)
		return 0, false
	}
	return d, true
}

// writeJSON writes v as npubroker status --json prints it (indented, or
// as one line).
func (s *Server) writeJSON(w http.ResponseWriter, v any, indent bool) {
	var buf bytes.Buffer
	if err := cli.WriteJSON(&buf, v, indent); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(buf.Bytes())
}

func (s *Server) brokerDown(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	json.NewEncoder(w).Encode(map[string]string{"error": "the broker did not answer: " + err.Error()})
}
