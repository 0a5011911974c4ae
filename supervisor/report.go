package supervisor

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/wire"
)

// How long and how often the supervisor tries to reach the broker: it may
// be restarting, and what the supervisor has to say (its task's end, or
// that its task never started) must survive that. Variables so that tests
// can shorten them.
var (
	reportFor  = 24 * time.Hour
	minBackoff = 100 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// report tells the broker how the task ended, retrying with backoff until
// it acknowledges (0) or reportFor has passed, or SIGTERM comes on term
// meanwhile (1).
func report(spec *wire.Spec, st *wire.Status, term <-chan os.Signal) int {
	code := tell(spec.Socket, fmt.Sprintf("report task %d", spec.ID), term, func(c *wire.Conn) error {
		return c.TaskDone(spec.ID, st)
	})
	if code == refusedForGood {
		return 1
	}
	return code
}

// notStarted tells a broker that the task never got its go-ahead: the
// broker that started this supervisor went away without a word, and may
// have recorded the task's start; the next one puts the task back in line
// on this word, given by the pid its start record names (SO_PEERCRED).
// This supervisor never runs the task after that. It returns 0 once a
// broker has taken the word or answered that there was nothing to undo
// (the start was not recorded), 1 when it gave up after reportFor or at
// SIGTERM on term.
func notStarted(spec *wire.Spec, term <-chan os.Signal) int {
	code := tell(spec.Socket, fmt.Sprintf("say that task %d never started", spec.ID), term, func(c *wire.Conn) error {
		return c.TaskNotStarted(spec.ID)
	})
	if code == refusedForGood {
		return 0
	}
	return code
}

// refusedForGood is tell's status for a broker that refused for good.
const refusedForGood = -1

// passes tells whether a broker's refusal code says that it cannot take
// a word now, and may later: its journal cannot be written (spool), it is
// busy, or a cap on its connections or requests is reached (too-many: a
// broker that restarts is asked by every client at once).
func passes(code string) bool {
	return code == wire.CodeSpool || code == wire.CodeBusy || code == wire.CodeTooMany
}

// tell makes the exchange ask with the broker at socket, retrying with
// backoff while no broker answers, or one answers that it cannot take it
// now (passes). It returns 0 once it is taken, refusedForGood (after
// a warning) when the broker refused it for good, 1 when reportFor has
// passed or SIGTERM came on term (a supervisor whose broker is gone for
// good is ended as any process is: the next broker finds its task gone);
// what names the exchange in warnings. A try is made first whatever came:
// the broker's own cancel of the task (SIGTERM) is read by the run, and a
// broker that answers takes the report.
func tell(socket, what string, term <-chan os.Signal, ask func(*wire.Conn) error) int {
	giveUp := time.Now().Add(reportFor)
	wait := minBackoff
	for {
		err := tellOnce(socket, ask)
		if err == nil {
			return 0
		}
		var refused *wire.Error
		if errors.As(err, &refused) && !passes(refused.Code) {
			// The broker answered, and its answer will not change.
			warn("%s: %v", what, err)
			return refusedForGood
		}
		if time.Now().Add(wait).After(giveUp) {
			warn("%s: %v; gave up after %s", what, err, quantity.Duration(reportFor))
			return 1
		}
		select {
		case <-time.After(wait):
		case <-term:
			warn("%s: %v; gave up at SIGTERM", what, err)
			return 1
		}
		wait = min(2*wait, maxBackoff)
	}
}

// tellOnce makes one attempt at an exchange.
func tellOnce(socket string, ask func(*wire.Conn) error) error {
	c, err := wire.Dial(socket)
	if err != nil {
		return err
	}
	defer c.Close()
	return ask(c)
}
