package supervisor

import (
	"testing"

	"github.com/npurun/npurun/wire"
)

// The log's last line says a task's end in task-submit's words
// (wire.EndHow): where no exit status is known, why alone, as task-submit
// says "failed: its processes could not be killed within 10s".
func TestDescribeEnd(t *testing.T) {
	three := 3
	for _, tt := range []struct {
		st   wire.Status
		want string
	}{
		{wire.Status{Exit: &three}, "exit 3"},
		{wire.Status{Signal: "SIGTERM", Reason: "cancelled"}, "killed by SIGTERM (cancelled)"},
		{wire.Status{Reason: "its processes could not be killed within 10s"}, "its processes could not be killed within 10s"},
		{wire.Status{}, "status unknown"},
	} {
		if got := describe(&tt.st); got != tt.want {
			t.Errorf("describe(%+v) = %q, want %q", tt.st, got, tt.want)
		}
	}
}
