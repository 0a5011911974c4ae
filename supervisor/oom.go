package supervisor

import (
	"bytes"
	"io"
	"os"
)

// OOMMessages are what the device runtimes print when a process runs out
// of device memory: the one list that tells an out-of-memory failure
// (task-submit --oom-retries) from any other. Matched as bytes, case and
// all, in the tail of what a task's run wrote to its log.
var OOMMessages = []string{
	// CUDA and PyTorch on NVIDIA.
	"CUDA out of memory",
	"torch.cuda.OutOfMemoryError",
	"CUDA_ERROR_OUT_OF_MEMORY",
	"cudaErrorMemoryAllocation",
	// torch_npu on Ascend.
	"NPU out of memory",
	"torch.npu.OutOfMemoryError",
	// CANN's runtime and ACL on Ascend.
	"ACL_ERROR_RT_MEMORY_ALLOCATION",
	"EL0004", // CANN's error code: device memory allocation failed
	"aclrtMalloc failed",
}

// oomTail is how much of the end of a run's log is looked at.
const oomTail = 64 << 10

// outOfMemory tells whether what log holds past offset from (a run's own
// output: a task's retry appends to the log of the task it retries) ends
// with an out-of-memory message, within its last oomTail bytes.
func outOfMemory(log *os.File, from int64) bool {
	st, err := log.Stat()
	if err != nil {
		return false
	}
	start := max(from, st.Size()-oomTail)
	if start >= st.Size() {
		return false
	}
	buf := make([]byte, st.Size()-start)
	n, err := log.ReadAt(buf, start)
	if err != nil && err != io.EOF {
		return false
	}
	for _, m := range OOMMessages {
		if bytes.Contains(buf[:n], []byte(m)) {
			return true
		}
	}
	return false
}
