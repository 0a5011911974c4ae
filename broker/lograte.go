package broker

import (
	"fmt"
	"log"
	"sync"
	"time"
)

// A line the broker may log again and again while a cause lasts (out of
// descriptors: every accept and every retry fails the same way) is said
// once per repeatEvery: the first time at once, the repeats within the
// interval counted, and said with the next line that is let through.

// repeatEvery is how often one repeated line is logged at most.
const repeatEvery = 10 * time.Second

// maxRepeatKeys bounds the lines remembered; past it they are forgotten
// (and so let through once more).
const maxRepeatKeys = 256

// rateLog logs through a log.Logger, each distinct line at most once per
// repeatEvery. The zero value needs only log set.
type rateLog struct {
	log *log.Logger
	mu  sync.Mutex
	m   map[string]*repeat
}

type repeat struct {
	at     time.Time // when it was last logged
	missed int       // repeats not logged since
}

// Printf logs the line unless it was logged less than repeatEvery ago.
func (r *rateLog) Printf(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	now := time.Now()
	r.mu.Lock()
	if r.m == nil || len(r.m) >= maxRepeatKeys {
		r.m = map[string]*repeat{}
	}
	rp := r.m[line]
	switch {
	case rp == nil:
		r.m[line] = &repeat{at: now}
	case now.Sub(rp.at) < repeatEvery:
		rp.missed++
		r.mu.Unlock()
		return
	default:
		if rp.missed > 0 {
			line += fmt.Sprintf(" (%d more times since %s)", rp.missed, rp.at.Format("15:04:05"))
		}
		rp.at, rp.missed = now, 0
	}
	r.mu.Unlock()
	r.log.Print(line)
}

// Write makes a rateLog a writer for a log.Logger of another part (the
// metrics' HTTP server): each line is one Printf.
func (r *rateLog) Write(p []byte) (int, error) {
	line := string(p)
	for len(line) > 0 && line[len(line)-1] == '\n' {
		line = line[:len(line)-1]
	}
	r.Printf("%s", line)
	return len(p), nil
}
