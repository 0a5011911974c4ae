package wire

import (
	"errors"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// TestExitStatus: the one table of exit statuses for what a broker says
// or what became of the connection, npurun's, task-submit's and
// npubroker's alike.
func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{&Error{Code: CodeNoSuchTask}, 1},
		{&Error{Code: CodeDenied}, 77},
		{&Error{Code: CodeBusy}, 75},
		{&Error{Code: CodeTooMany}, 75},
		{fmt.Errorf("send request: %w", &Error{Code: CodeTooMany}), 75},
		{&Error{Code: CodeSpool}, 75},
		{&Error{Code: CodeBadRequest}, 2},
		{&Error{Code: CodeNoSuchPool}, 2},
		{&Error{Code: CodeNoDevice}, 2},
		{&Error{Code: "something-new"}, 1},
		{fmt.Errorf("%w: x", ErrSubmitUnknown), 3},
		{fmt.Errorf("%w at /x: no such file", ErrNoBroker), 69},
		{fmt.Errorf("%w at /x: no answer", ErrNoAnswer), 69},
		{ErrClosed, 69},
		{unix.ECONNRESET, 69},
		{fmt.Errorf("send: %w", unix.EPIPE), 69},
		{ErrTimeout, 75},
		{errors.New("decode reply: bad"), 1},
	} {
		if got := ExitStatus(tc.err); got != tc.want {
			t.Errorf("ExitStatus(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}
