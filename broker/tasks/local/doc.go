// Package local is the task room's local runner (tasks.Runner): it runs
// granted tasks on this machine as their submitters, each under a
// supervisor (`npurun-supervise`, found and checked in supervisorbin.go),
// with warm supervisors started ahead of a grant and idle ones kept per
// user (idle.go), each task in a control group of its own (cgroup.go),
// and takes up the tasks a broker left running at its restart (adoption).
// broker.New makes it and gives it to the room (tasks.Config.Runner); it
// shares the room's lock through tasks.Host and lets it go while it
// waits (a process start, /proc). It must never touch the lease table or
// the journal directly: a task's grant, its start record and its end are
// the room's, which it tells through Host (Gone).
package local
