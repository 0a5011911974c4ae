package broker

import (
	"context"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
)

// shareCapacities is what the shares of each device that the policy
// shares ([share] pools) may declare together, in MiB: its memory, from
// the configuration ([share] capacity, capacities) or else the vendor's
// tool, less the margin. A device whose memory the tool could not say
// (it failed, or did not list the device) is in unknown, with why: it
// takes no share until askCapacities learns it. One whose memory nothing
// can say (no tool: the fake vendor) is not shared, and the log says so.
func (s *Server) shareCapacities(pools []lease.Pool) (capacity map[int]int64, unknown map[int]string) {
	if len(s.policy().Share.Pools) == 0 {
		return nil, nil
	}
	var ids []int
	for _, p := range pools {
		if !s.policy().Share.Shares(p.Name) || p.External != "" {
			continue
		}
		if p.IDs == nil {
			ids = append(ids, s.inv.IDs...)
		} else {
			ids = append(ids, p.IDs...)
		}
	}
	capacity, unknown = map[int]int64{}, map[int]string{}
	for id, c := range s.learnCapacities(ids) {
		if c.unknown != "" {
			s.log.Printf("npu %d: its memory is unknown (%s); no share on it until it is known: the broker asks again", id, c.unknown)
			unknown[id] = c.unknown
		} else if c.mib > 0 {
			capacity[id] = c.mib
		}
	}
	return capacity, unknown
}

// shareCap is a shared device's capacity for shares: mib > 0, it may
// hold shares of that much together; unknown, the vendor's tool could not
// say its memory (why); neither, it is not shared.
type shareCap struct {
	mib     int64
	unknown string
}

// learnCapacities works out the share capacity of each of ids, asking the
// vendor's tool (once) for those [share] gives none. A device whose
// memory is no more than the margin, or that no tool can say, is not
// shared, and the log says so. It runs the tool: call it holding no lock.
func (s *Server) learnCapacities(ids []int) map[int]shareCap {
	cfg := s.policy()
	var vendor map[int]int64
	var vendorErr error
	asked := false
	out := map[int]shareCap{}
	for _, id := range ids {
		c := cfg.Share.CapacityOf(id)
		if c == 0 {
			if !asked {
				vendor, vendorErr = s.inv.Memory(npu.Tools{NVIDIASmi: cfg.NVIDIASmi})
				asked = true
			}
			c = vendor[id]
		}
		switch {
		case c == 0 && vendorErr != nil:
			out[id] = shareCap{unknown: vendorErr.Error()}
		case c == 0 && vendor != nil:
			out[id] = shareCap{unknown: "the vendor's tool does not list it"}
		case c == 0:
			s.log.Printf("npu %d: its memory is unknown (the vendor's tool does not say, [share] gives no capacity); it is not shared", id)
			out[id] = shareCap{}
		case c <= cfg.Share.Margin:
			s.log.Printf("npu %d: its memory, %s, is no more than the margin kept free ([share] margin = %q); it is not shared", id, quantity.Size(c), quantity.Size(cfg.Share.Margin))
			out[id] = shareCap{}
		default:
			out[id] = shareCap{mib: c - cfg.Share.Margin}
		}
	}
	return out
}

// Asking the vendor's tool again for a shared device's memory that it
// could not say: capacityRetryMin after the last time at first, then
// twice as long each time it still cannot, up to capacityRetryMax; at
// once when a share request comes that such a device could serve, but
// never sooner than capacityRetryMin after the last time.
const (
	capacityRetryMin = time.Second
	capacityRetryMax = 2 * time.Minute
)

// askCapacities asks the vendor's tool again, until ctx is done or it
// has said, for the memory of each shared device that it could not say
// (lease.Table.Unknown), on a goroutine of its own, holding no lock while
// the tool runs. A device whose memory it learns takes shares from then
// on, as the configuration says, and the line is served at once.
func (s *Server) askCapacities(ctx context.Context) {
	wait, last := capacityRetryMin, time.Now()
	for {
		ids := s.table.Unknown()
		if len(ids) == 0 {
			return
		}
		t := time.NewTimer(time.Until(last.Add(wait)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.capacityAsk: // a share request that one could serve
			t.Stop()
			if early := time.Until(last.Add(capacityRetryMin)); early > 0 {
				t = time.NewTimer(early)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
		case <-t.C:
			wait = min(wait*2, capacityRetryMax)
		}
		last = time.Now()
		var refused []lease.Refused
		changed := false
		for id, c := range s.learnCapacities(ids) {
			switch {
			case c.unknown != "":
				s.rlog.Printf("npu %d: its memory is still unknown (%s); no share on it until it is known", id, c.unknown)
				continue
			case c.mib > 0:
				s.log.Printf("npu %d: its memory is known now: it takes shares of %s together", id, quantity.Size(c.mib))
				s.status.Shared(id, c.mib)
			}
			refused = append(refused, s.table.SetCapacity(id, c.mib)...)
			changed = true
		}
		if !changed {
			continue
		}
		s.mu.Lock()
		tasks := s.refuseLocked(refused, "the broker refuses this request now that it knows its device's memory: ")
		s.mu.Unlock()
		for _, r := range tasks {
			s.tasks.Refuse(r.W, "the broker refuses it now that it knows its device's memory: "+r.Why.Msg)
		}
		(*tableOwner)(s).Freed() // the line, served on the devices that take shares now
	}
}
