package broker

import (
	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
)

// shareCapacities is what the shares of each device that the policy
// shares ([share] pools) may declare together, in MiB: its memory, from
// the configuration ([share] capacity, capacities) or else the vendor's
// tool, less the margin. A device whose memory is known from neither is
// not shared, and the log says so.
func (s *Server) shareCapacities(pools []lease.Pool) map[int]int64 {
	if len(s.policy().Share.Pools) == 0 {
		return nil
	}
	var vendor map[int]int64
	out := map[int]int64{}
	for _, p := range pools {
		if !s.policy().Share.Shares(p.Name) || p.External != "" {
			continue
		}
		ids := p.IDs
		if ids == nil {
			ids = s.inv.IDs
		}
		for _, id := range ids {
			c := s.policy().Share.CapacityOf(id)
			if c == 0 {
				if vendor == nil {
					vendor = s.inv.Memory(npu.Tools{NVIDIASmi: s.policy().NVIDIASmi})
				}
				c = vendor[id]
			}
			switch {
			case c == 0:
				s.log.Printf("npu %d: its memory is unknown (the vendor's tool does not say, [share] gives no capacity); it is not shared", id)
			case c <= s.policy().Share.Margin:
				s.log.Printf("npu %d: its memory, %s, is no more than the margin kept free ([share] margin = %q); it is not shared", id, quantity.Size(c), quantity.Size(s.policy().Share.Margin))
			default:
				out[id] = c - s.policy().Share.Margin
			}
		}
	}
	return out
}
