package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/wire"
)

// TestNotice: a supervisor given a Spec with Notice (a notify-only launch)
// runs the notify command with NPURUN_TASK_STATE set to it, its exit and
// signal empty, in the task's directory, and exits 0, running nothing
// else (not the task's command) and reporting nothing; a notice other
// than idle is refused (2).
func TestNotice(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		spec := newSpec(t, "sh", "-c", "echo ran > ran")
		spec.Notify = `echo "$NPURUN_TASK_ID $NPURUN_TASK_STATE exit=$NPURUN_TASK_EXIT signal=$NPURUN_TASK_SIGNAL name=$NPURUN_TASK_NAME" > notified`
		spec.Name = "train"
		spec.Notice = wire.NoticeIdle
		b := listen(t, spec.Socket)
		s := startSupervisor(t, spec, nil)
		if code := s.wait(t); code != 0 {
			t.Fatalf("supervisor exit %d, want 0; stderr:\n%s", code, s.stderr)
		}
		got, err := os.ReadFile(filepath.Join(spec.Cwd, "notified"))
		if err != nil {
			t.Fatalf("the notify command did not run: %v; stderr:\n%s", err, s.stderr)
		}
		if want := "7 idle exit= signal= name=train\n"; string(got) != want {
			t.Errorf("the notify command wrote %q, want %q", got, want)
		}
		if _, err := os.Stat(filepath.Join(spec.Cwd, "ran")); err == nil {
			t.Errorf("the task's command ran under a notify-only supervisor")
		}
		select {
		case req := <-b.reports:
			t.Errorf("a notify-only supervisor reported %+v", req)
		default:
		}
	})
	t.Run("unknown notice", func(t *testing.T) {
		spec := newSpec(t, "true")
		spec.Notify = "echo ran > notified"
		spec.Notice = wire.StateDone
		s := startSupervisor(t, spec, nil)
		if code := s.wait(t); code != 2 {
			t.Fatalf("supervisor exit %d, want 2; stderr:\n%s", code, s.stderr)
		}
		if !strings.Contains(s.stderr.String(), `asks for a notice "done"`) {
			t.Errorf("stderr does not say why:\n%s", s.stderr)
		}
		if _, err := os.Stat(filepath.Join(spec.Cwd, "notified")); err == nil {
			t.Errorf("the notify command ran for a refused notice")
		}
	})
}
