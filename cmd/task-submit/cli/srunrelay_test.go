package cli

import (
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// seen is a writer that tells each write.
type seen struct {
	mu    sync.Mutex
	got   strings.Builder
	wrote chan struct{}
}

func (s *seen) Write(b []byte) (int, error) {
	s.mu.Lock()
	s.got.Write(b)
	s.mu.Unlock()
	select {
	case s.wrote <- struct{}{}:
	default:
	}
	return len(b), nil
}

func (s *seen) await(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		s.mu.Lock()
		got := s.got.String()
		s.mu.Unlock()
		if got == want {
			return
		}
		select {
		case <-s.wrote:
		case <-deadline:
			t.Fatalf("relayed %q, want %q", got, want)
		}
	}
}

// TestRelayPartialLines: srun's standard error as npurun relays it: a
// command's progress bar (\r, no newline) goes on as it is drawn, not at
// the line's end; srun's own lines about the job do not.
func TestRelayPartialLines(t *testing.T) {
	out := &seen{wrote: make(chan struct{}, 1)}
	defer func(was any) { srunStderr = was.(*os.File) }(srunStderr)
	srunStderr = out
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &srunProgress{stop: make(chan struct{})}
	done := make(chan struct{})
	go func() { p.relay(r); close(done) }()
	w.WriteString("sr") // may be srun's: held
	w.WriteString("un: job 5 queued and waiting for resources\n")
	w.WriteString(" 10%\r")
	out.await(t, " 10%\r")
	w.WriteString(" 20%\r")
	out.await(t, " 10%\r 20%\r")
	w.WriteString("\ns")
	out.await(t, " 10%\r 20%\r\n")
	w.WriteString("tep done\nsrun: error: n1: task 0: Exited with exit code 3\nlast")
	w.Close()
	<-done
	out.await(t, " 10%\r 20%\r\nstep done\nlast")
	if p.job != 5 {
		t.Errorf("the queued line's job not read: %d", p.job)
	}
}
