package board

import (
	"strconv"
	"time"

	"github.com/npurun/npurun/wire"
)

// utilRing keeps each device's utilization samples of the last span, for
// the sparklines; at most maxSamples a device.
type utilRing struct {
	span time.Duration
	by   map[int][]Sample
}

const maxSamples = 720

func newUtilRing(span time.Duration) *utilRing {
	return &utilRing{span: span, by: map[int][]Sample{}}
}

// add keeps the devices' samples of a board taken at.
func (u *utilRing) add(at time.Time, devs []wire.DeviceState) {
	cut := at.Add(-u.span).UnixMilli()
	for _, d := range devs {
		s := Sample{T: at.UnixMilli(), U: -1}
		if d.Util != nil {
			s.U = *d.Util
		}
		xs := u.by[d.ID]
		if n := len(xs); n > 0 && xs[n-1].T >= s.T {
			continue
		}
		i := 0
		for i < len(xs) && xs[i].T < cut {
			i++
		}
		if len(xs)-i >= maxSamples {
			i = len(xs) - maxSamples + 1
		}
		u.by[d.ID] = append(xs[i:], s)
	}
}

// series copies the samples, by device id.
func (u *utilRing) series() map[string][]Sample {
	out := make(map[string][]Sample, len(u.by))
	for id, xs := range u.by {
		out[strconv.Itoa(id)] = append([]Sample(nil), xs...)
	}
	return out
}

// intern makes the repeated strings of a box's history and line one copy
// each (a day of a busy box is 10,000 leases naming a few devices, kinds
// and users): the copies the decoder made are garbage once it is done.
func intern(box *Box) {
	seen := map[string]string{}
	one := func(s *string) {
		if v, ok := seen[*s]; ok {
			*s = v
		} else {
			seen[*s] = *s
		}
	}
	if h := box.History; h != nil {
		for i := range h.Entries {
			e := &h.Entries[i]
			one(&e.Name)
			one(&e.Kind)
			one(&e.User)
			one(&e.Pool)
			one(&e.How)
		}
	}
	if st := box.Status; st != nil {
		for i := range st.Waiting {
			for j := range st.Waiting[i].Waiters {
				w := &st.Waiting[i].Waiters[j]
				one(&w.User)
				one(&w.Kind)
				one(&w.Why)
			}
		}
	}
}
