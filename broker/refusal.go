package broker

import (
	"errors"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/refusal"
	"github.com/npurun/npurun/broker/tasks"
	"github.com/npurun/npurun/wire"
)

// refusalReply is the answer to a request a room refused (the lease
// table's or the task room's Refusal): the one mapping of their reasons to
// the wire's codes. An error that is no Refusal is a bad request.
func refusalReply(err error) *wire.Reply {
	var r *refusal.Refusal
	if !errors.As(err, &r) {
		return errReply(wire.CodeBadRequest, err.Error(), "")
	}
	code := wire.CodeDenied
	switch {
	case errors.Is(r, lease.ErrBadRequest), errors.Is(r, tasks.ErrBadRequest):
		code = wire.CodeBadRequest
	case errors.Is(r, lease.ErrNoDevice):
		code = wire.CodeNoDevice
	case errors.Is(r, lease.ErrNoPool):
		code = wire.CodeNoSuchPool
	case errors.Is(r, tasks.ErrTooMany):
		code = wire.CodeTooMany
	case errors.Is(r, tasks.ErrNoSuchTask):
		code = wire.CodeNoSuchTask
	case errors.Is(r, tasks.ErrBusy):
		code = wire.CodeBusy
	case errors.Is(r, tasks.ErrSpool):
		code = wire.CodeSpool
	}
	return errReply(code, r.Msg, r.Hint)
}
