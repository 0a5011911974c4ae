// Package testhook stops a broker at a named point, for a test that must kill it inside a window too narrow to hit by chance.
package testhook

import (
	"log"
	"os"
)

// The point is named by NPUBROKER_TEST_HOOK in the broker's environment,
// read once at start; unset, as in production, Stop does nothing. The
// points are named where Stop is called (broker/tasks/testhook.go,
// broker/drain.go).
var point = os.Getenv("NPUBROKER_TEST_HOOK")

// Stop, at the point named by NPUBROKER_TEST_HOOK, says so in the log
// ("test hook POINT: WHAT stops here") and stops the calling goroutine
// for good (the test then kills the broker); the rest of the broker
// serves on.
func Stop(lg *log.Logger, at, what string) {
	if point != at {
		return
	}
	lg.Printf("test hook %s: %s stops here", at, what)
	select {}
}
