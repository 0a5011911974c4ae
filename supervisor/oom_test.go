package supervisor

import (
	"os"
	"path/filepath"
	"testing"
)

// TestOutOfMemory: a run's own output is looked at, not what an earlier
// run (the task a retry retries) left in the same log.
func TestOutOfMemory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString("step 1\nRuntimeError: NPU out of memory. Tried to allocate 2.00 GiB\n")
	if !outOfMemory(f, 0) {
		t.Error("the message was not found")
	}
	st, _ := f.Stat()
	f.WriteString("ValueError: bad input\n")
	if outOfMemory(f, st.Size()) {
		t.Error("an earlier run's message was taken for this run's")
	}
	f.WriteString("torch.OutOfMemoryError: CUDA out of memory.\n")
	if !outOfMemory(f, st.Size()) {
		t.Error("this run's CUDA message was not found")
	}
}
