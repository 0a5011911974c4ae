// Package testhook stops a broker at a named point, holds it there a
// while, or makes a named fault happen once, for a test that must kill it
// (or reach it) inside a window too narrow to hit by chance. It imports
// only the standard library, and a hook does nothing unless a test's
// environment names it.
package testhook

import (
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// The points are named by NPUBROKER_TEST_HOOK in the broker's
// environment, separated by commas, read once at start; unset, as in
// production, Stop, Pause and Fails do nothing. The points are named
// where they are used (broker/tasks/testhook.go, broker/drain.go,
// broker/lease/ending.go).
var (
	points = strings.Split(os.Getenv("NPUBROKER_TEST_HOOK"), ",")
	mu     sync.Mutex
	failed = map[string]bool{}
)

func named(at string) bool { return at != "" && slices.Contains(points, at) }

// Stop, at a point named by NPUBROKER_TEST_HOOK, says so in the log
// ("test hook POINT: WHAT stops here") and stops the calling goroutine
// for good (the test then kills the broker); the rest of the broker
// serves on.
func Stop(lg *log.Logger, at, what string) {
	if !named(at) {
		return
	}
	lg.Printf("test hook %s: %s stops here", at, what)
	select {}
}

// Fails tells, the first time only, whether the fault at is named by
// NPUBROKER_TEST_HOOK: the caller then fails as the fault would make it.
func Fails(at string) bool {
	if !named(at) {
		return false
	}
	mu.Lock()
	defer mu.Unlock()
	if failed[at] {
		return false
	}
	failed[at] = true
	return true
}

// Pause, at a point named by NPUBROKER_TEST_HOOK, holds the calling
// goroutine for d: a window that a loaded machine opens now and then,
// opened every time.
func Pause(at string, d time.Duration) {
	if named(at) {
		time.Sleep(d)
	}
}
