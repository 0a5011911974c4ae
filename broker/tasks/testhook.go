package tasks

import (
	"log"
	"os"
)

// Points where a broker stops for a test that must kill it inside a
// window too narrow to hit by chance (tests/e2e_task_faults_test.go). The
// point is named by NPUBROKER_TEST_HOOK in the broker's environment, read
// once at start; unset, as in production, testHook does nothing.
const (
	// hookBeforeGoAhead: a task's start is recorded and its go-ahead not
	// yet sent.
	hookBeforeGoAhead = "before-go-ahead"
	// hookBeforeSubmitReply: a submission is recorded and its answer not
	// yet sent (the task room's lock is held: no task starts, nor is any task
	// operation served).
	hookBeforeSubmitReply = "before-submit-reply"
	// hookAfterEnd: a task's end is recorded (with its out-of-memory
	// retry, if any) and nothing else done for it yet: its supervisor not
	// answered, its retry not in line (the task room's lock is held).
	hookAfterEnd = "after-end"
)

var testHookPoint = os.Getenv("NPUBROKER_TEST_HOOK")

// testHook, at the point named by NPUBROKER_TEST_HOOK, says so in the log
// and stops the calling goroutine for good (the test then kills the
// broker); the rest of the broker serves on.
func testHook(lg *log.Logger, point string, id uint64) {
	if testHookPoint != point {
		return
	}
	lg.Printf("test hook %s: task %d stops here", point, id)
	select {}
}
