package wire

import "testing"

func TestEndHow(t *testing.T) {
	three := 3
	for _, tt := range []struct {
		exit           *int
		signal, reason string
		want           string
	}{
		{&three, "", "", "exit 3"},
		{nil, "SIGSEGV", "", "killed by SIGSEGV"},
		{nil, "SIGKILL", "time limit 1h0m0s reached", "killed by SIGKILL (time limit 1h0m0s reached)"},
		{&three, "", "cancelled", "exit 3 (cancelled)"},
		{nil, "", "its processes could not be killed within 10s", "its processes could not be killed within 10s"},
		{nil, "", "", ""},
	} {
		if got := EndHow(tt.exit, tt.signal, tt.reason); got != tt.want {
			t.Errorf("EndHow(%v, %q, %q) = %q, want %q", tt.exit, tt.signal, tt.reason, got, tt.want)
		}
	}
}
