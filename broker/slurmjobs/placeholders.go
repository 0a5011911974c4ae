package slurmjobs

import (
	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/broker/lease"
)

// placeholders are allocate mode's placeholder allocations.
type placeholders struct {
	r *Room
}

// placeholder is one request's placeholder allocation.
type placeholder struct {
	job uint32
}

func newPlaceholders(r *Room) *placeholders { return &placeholders{r: r} }

func (ph *placeholders) byJob(id uint32) *placeholder { return nil }

func (ph *placeholders) prolog(p *placeholder, sj client.SlurmJob, ids []int, progress func(string)) ([]int, string, error) {
	return nil, "", refuse(client.CodeNoSlurm, "allocate mode is not served yet")
}

func (ph *placeholders) epilog(p *placeholder) string { return "" }

func (ph *placeholders) released(l *lease.Lease) {}
