package tasks

import (
	"log"
	"strconv"

	"github.com/npurun/npurun/internal/testhook"
)

// Points where a broker stops for a test that must kill it inside a
// window too narrow to hit by chance (tests/e2e/tasks/e2e_task_faults_test.go),
// named by NPUBROKER_TEST_HOOK (internal/testhook).
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

// testHook stops task id's goroutine at point (testhook.Stop).
func testHook(lg *log.Logger, point string, id uint64) {
	testhook.Stop(lg, point, "task "+strconv.FormatUint(id, 10))
}
