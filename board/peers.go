package board

import (
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/npurun/npurun/board/fetch"
	"github.com/npurun/npurun/wire"
)

// A peer is another box's npuboard. Its /api/box is fetched when the page
// is drawn and its last answer is older than a refresh: every peer at
// once, each within the timeout and the size bound, so that a peer that
// never answers costs the page its timeout once per refresh and holds up
// no other. What it sends is parsed into Box, the local box's own type: a
// string of it is drawn by the template like any other, escaped.
type peer struct {
	url     string
	client  *http.Client
	max     int64
	timeout time.Duration
	refresh time.Duration

	mu        sync.Mutex
	at        time.Time // of the last fetch's end
	box       *Box
	downSince int64
	fetching  chan struct{} // closed when the fetch under way ends
}

// get returns the peer's box: the last answer where it is fresh, else a
// new one, waiting for it at most the timeout (and a little).
func (p *peer) get() *Box {
	p.mu.Lock()
	if p.box != nil && time.Since(p.at) < p.refresh {
		b := p.box
		p.mu.Unlock()
		return b
	}
	done := p.fetching
	if done == nil {
		done = make(chan struct{})
		p.fetching = done
		go p.fetch(done)
	}
	p.mu.Unlock()
	select {
	case <-done:
	case <-time.After(p.timeout + 500*time.Millisecond):
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.box == nil {
		return &Box{Name: p.url, URL: p.url, Down: "no answer yet", DownSince: time.Now().UnixMilli()}
	}
	return p.box
}

func (p *peer) fetch(done chan struct{}) {
	box, err := p.ask()
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if p.downSince == 0 {
			p.downSince = now.UnixMilli()
		}
		name := p.url
		if p.box != nil {
			name = p.box.Name
		}
		box = &Box{Name: name, URL: p.url, Down: err.Error(), DownSince: p.downSince}
	} else {
		p.downSince = 0
	}
	p.box, p.at, p.fetching = box, now, nil
	close(done)
}

// ask fetches and parses the peer's /api/box.
func (p *peer) ask() (*Box, error) {
	var box Box
	if err := fetch.JSON(p.client, p.url+"/api/box", p.timeout, p.max, &box); err != nil {
		return nil, err
	}
	if box.Status == nil || box.Name == "" {
		return nil, errors.New("answered what is not npuboard's JSON (no status)")
	}
	if box.History == nil {
		box.History = &wire.HistoryReport{}
	}
	box.URL = p.url
	intern(&box)
	return &box, nil
}

// boxes returns this box's data and every peer's, fetched at once.
func (s *Server) boxes() []*Box {
	out := make([]*Box, 1+len(s.peers))
	var wg sync.WaitGroup
	for i, p := range s.peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[1+i] = p.get()
		}()
	}
	out[0] = s.localData(false)
	wg.Wait()
	return out
}
