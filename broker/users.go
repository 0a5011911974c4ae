package broker

import (
	"os/user"
	"strconv"
	"sync"
	"time"
)

// account is what the broker knows of a uid: its name and groups, read
// from the system's user database and kept for a short while.
type account struct {
	name   string
	groups []string
	at     time.Time
}

type accounts struct {
	mu sync.Mutex
	m  map[uint32]*account
}

const accountTTL = 30 * time.Second

func (a *accounts) lookup(uid uint32) *account {
	a.mu.Lock()
	acc := a.m[uid]
	a.mu.Unlock()
	if acc != nil && time.Since(acc.at) < accountTTL {
		return acc
	}
	acc = &account{name: "uid " + strconv.Itoa(int(uid)), at: time.Now()}
	if u, err := user.LookupId(strconv.Itoa(int(uid))); err == nil {
		acc.name = u.Username
		if gids, err := u.GroupIds(); err == nil {
			for _, gid := range gids {
				if g, err := user.LookupGroupId(gid); err == nil {
					acc.groups = append(acc.groups, g.Name)
				}
			}
		}
	}
	a.mu.Lock()
	if a.m == nil {
		a.m = map[uint32]*account{}
	}
	a.m[uid] = acc
	a.mu.Unlock()
	return acc
}
