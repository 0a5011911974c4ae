package shim

import (
	"bytes"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/clusterconf"
	"github.com/npurun/npurun/internal/exitcode"
)

// On a login node npurun.conf has a [cluster] table and npurun's work goes
// through Slurm: npurun becomes `task-submit __npurun OPTIONS -- COMMAND`,
// whose Slurm client (package cluster, its srun) stays out of npurun's own
// start, as npubroker's status does (report.go). Only the configuration's
// bytes are read here, one file, with no parsing: task-submit parses it.

// InstalledTaskSubmit is task-submit's path as installed (make install
// sets it to $(BINDIR)/task-submit).
var InstalledTaskSubmit = "/usr/bin/task-submit"

// loginNode tells whether this machine's configuration sends npurun's
// work to a cluster's scheduler (clusterconf: the test task-submit makes
// too). Inside a Slurm job (SLURM_JOB_ID) it never does: a nested npurun
// is the job's.
func loginNode() bool {
	if os.Getenv("SLURM_JOB_ID") != "" {
		return false
	}
	_, has, _ := clusterconf.Read(clusterconf.Path())
	return has
}

// runCluster becomes task-submit __npurun with o and argv.
func runCluster(o Options, argv []string) int {
	if len(o.Devices) > 0 || o.Container != "" {
		warn("-d and --container are a box's: on a login node Slurm places the command on a node")
		hint("give a count instead: npurun -n N COMMAND")
		return exitcode.Usage
	}
	args := ClusterArgs(o, argv)
	path := beside("task-submit", InstalledTaskSubmit)
	err := unix.Exec(path, args, os.Environ())
	warn("%s: %v", path, err)
	hint("on a login node ([cluster] in %s) npurun runs its command through task-submit: install task-submit", clusterconf.Path())
	if err == unix.ENOENT {
		return exitcode.NotFound
	}
	return exitcode.NoExec
}

// ClusterArgs is the command line npurun on a login node becomes:
// `task-submit __npurun OPTIONS -- COMMAND`, with o's options that a
// cluster's scheduler takes (task-submit's parseSrun reads them back).
func ClusterArgs(o Options, argv []string) []string {
	args := []string{"task-submit", "__npurun"}
	if o.N > 0 {
		args = append(args, "-n", strconv.Itoa(o.N))
	}
	if o.Pool != "" {
		args = append(args, "-p", o.Pool)
	}
	if o.Mem > 0 {
		args = append(args, "-m", strconv.FormatInt(o.Mem, 10)+"M")
	}
	if o.NoDevice {
		args = append(args, "--no-device")
	}
	if o.NoWait {
		args = append(args, "--no-wait")
	}
	if o.Time > 0 {
		args = append(args, "--time", strconv.FormatInt(int64((o.Time+time.Second-1)/time.Second), 10)+"s")
	}
	if o.Timeout > 0 {
		args = append(args, "--timeout", strconv.FormatInt(int64((o.Timeout+time.Second-1)/time.Second), 10)+"s")
	}
	if o.Verbose {
		args = append(args, "-v")
	}
	if o.Quiet {
		args = append(args, "-q")
	}
	args = append(args, "--")
	return append(args, argv...)
}

// beside is the program name beside npurun's executable (a build
// directory), else installed.
func beside(name, installed string) string {
	if exe, err := os.Readlink("/proc/self/exe"); err == nil {
		p := exe[:bytes.LastIndexByte([]byte(exe), '/')+1] + name
		if unix.Access(p, unix.X_OK) == nil {
			return p
		}
	}
	return installed
}
