package local

// Faults a test makes the local runner meet at a point too narrow to hit
// by chance (tests/e2e/tasks/e2e_task_faults_test.go), named by
// NPUBROKER_TEST_HOOK (internal/testhook: testhook.Fails).
const (
	// hookNoStartTime, a fault rather than a stop (testhook.Fails): the
	// first supervisor's start time cannot be read from /proc.
	hookNoStartTime = "no-start-time"
	// hookAdoptUnreadable and hookNoPidfd, faults: a broker that takes up
	// a running task finds /proc unreadable once as it looks at the task's
	// supervisor, and out of descriptors once as it opens the pidfd that
	// watches for its exit.
	hookAdoptUnreadable = "adopt-unreadable"
	hookNoPidfd         = "no-pidfd"
)
