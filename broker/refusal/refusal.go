// Package refusal is why a room of the broker refuses a request: the one
// type that the lease table and the task room answer with. A Refusal
// wraps the room's reason (one of its own errors, compared with
// errors.Is), a message for its user and a hint where a next step helps;
// the daemon maps it to the wire's codes in one place (refusalReply, in
// broker/refusal.go). It owns nothing else, and imports neither the wire
// nor any room.
package refusal

import "fmt"

// Refusal is why a request is refused: a room's reason, a message for its
// user, and a hint where a next step helps.
type Refusal struct {
	Err  error
	Msg  string
	Hint string
}

func (r *Refusal) Error() string { return r.Msg }
func (r *Refusal) Unwrap() error { return r.Err }

// New is the Refusal for err, its message formatted, with hint.
func New(err error, hint string, format string, args ...any) *Refusal {
	return &Refusal{Err: err, Msg: fmt.Sprintf(format, args...), Hint: hint}
}
