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
