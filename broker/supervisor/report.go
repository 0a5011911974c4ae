package supervisor

import (
	"errors"
	"fmt"
	"time"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/internal/quantity"
)

// How long and how often the supervisor tries to report: the broker may be
// restarting, and the task's end must survive that. Variables so that
// tests can shorten them.
var (
	reportFor  = 24 * time.Hour
	minBackoff = 100 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// report tells the broker how the task ended, retrying with backoff until
// it acknowledges (0) or reportFor has passed (1).
func report(spec *client.Spec, st *client.Status) int {
	giveUp := time.Now().Add(reportFor)
	wait := minBackoff
	for {
		err := tellBroker(spec.Socket, spec.ID, st)
		if err == nil {
			return 0
		}
		var refused *client.Error
		if errors.As(err, &refused) && refused.Code != client.CodeSpool {
			// The broker answered, and its answer will not change. (One
			// that could not record the end yet is asked again.)
			warn("%v", err)
			return 1
		}
		if time.Now().Add(wait).After(giveUp) {
			warn("%v; gave up after %s", err, quantity.Duration(reportFor))
			return 1
		}
		time.Sleep(wait)
		wait = min(2*wait, maxBackoff)
	}
}

// tellBroker makes one attempt at the task-done exchange.
func tellBroker(socket string, id uint64, st *client.Status) error {
	c, err := client.Dial(socket)
	if err != nil {
		return fmt.Errorf("report task %d: %w", id, err)
	}
	defer c.Close()
	if err := c.TaskDone(id, st); err != nil {
		return fmt.Errorf("report task %d: %w", id, err)
	}
	return nil
}
