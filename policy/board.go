package policy

import (
	"net/url"
	"time"
)

// Board configures npuboard, the lab's web page of the boxes ([board]):
// the broker itself reads none of it.
type Board struct {
	Listen  string        // host:port the page is served on
	Refresh time.Duration // how often the page, and the peers' data, are fresh
	Peers   []string      // the other boxes' npuboards: http(s)://host:port URLs
}

// Defaults of the [board] table.
const (
	DefaultBoardListen  = "127.0.0.1:9401" // loopback only: opening it to the lab is the administrator's choice
	DefaultBoardRefresh = 5 * time.Second
	// MinBoardRefresh and MaxBoardPeers bound [board] refresh and peers.
	MinBoardRefresh = time.Second
	MaxBoardPeers   = 64
)

func defaultBoard() Board {
	return Board{Listen: DefaultBoardListen, Refresh: DefaultBoardRefresh}
}

// board reads the [board] table.
func (p *parser) board(raw map[string]any, c *Config) {
	c.Board = defaultBoard()
	table := []string{"board"}
	t, ok := p.table(nil, raw, "board")
	if !ok {
		return
	}
	p.unknown(table, t, "listen", "refresh", "peers")
	if s, ok := p.listen(table, t, "listen", DefaultBoardListen, "0.0.0.0:9401"); ok {
		c.Board.Listen = s
	}
	if d, ok := p.duration(table, t, "refresh"); ok {
		if d < MinBoardRefresh {
			p.errorf(table, "refresh", "must be at least \"1s\", not %q", t["refresh"])
		} else {
			c.Board.Refresh = d
		}
	}
	if peers, ok := p.stringList(table, t, "peers"); ok {
		if len(peers) > MaxBoardPeers {
			p.errorf(table, "peers", "at most %d peers, not %d", MaxBoardPeers, len(peers))
			return
		}
		for _, s := range peers {
			if !BoardURL(s) {
				p.errorf(table, "peers", "want URLs of npuboards such as \"http://box2:9401\", not %q", s)
				return
			}
		}
		c.Board.Peers = peers
	}
}

// BoardURL tells whether s is an npuboard's URL as [board] peers and
// [cluster.boards] take it: http(s)://host[:port], no user, path, query
// or fragment.
func BoardURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.User == nil &&
		u.RawQuery == "" && u.Fragment == "" && (u.Path == "" || u.Path == "/")
}
