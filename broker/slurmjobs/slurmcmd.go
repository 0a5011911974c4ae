package slurmjobs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/npurun/npurun/broker/lease"
)

// Slurm's commands, as the broker runs them: sbatch as the request's
// user (its uid, gid and groups, an environment of HOME, USER, LOGNAME,
// PATH and the broker's SLURM_CONF, nothing else of the broker's), squeue
// and scancel as root; each bounded in time and in the output read, with
// arguments built from the configuration's checked names and numbers
// only, and no shell (--wrap's command is a constant).

// placeholderCommand is what a placeholder's batch step runs: nothing,
// for as long as Slurm lets it.
const placeholderCommand = "exec sleep 2147483647"

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// run runs a Slurm command, within timeout, and returns its standard
// output; an error carries what it said on standard error.
func (r *Room) run(cmd *exec.Cmd, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	c.Env, c.Dir, c.SysProcAttr = cmd.Env, cmd.Dir, cmd.SysProcAttr
	if c.Env == nil {
		c.Env = r.rootEnv()
	}
	if c.Dir == "" {
		c.Dir = "/"
	}
	if c.SysProcAttr == nil {
		c.SysProcAttr = &syscall.SysProcAttr{}
	}
	c.SysProcAttr.Setsid = true
	c.WaitDelay = time.Second
	out, errOut := &limitedBuffer{max: maxOutput}, &limitedBuffer{max: 4 << 10}
	c.Stdout, c.Stderr = out, errOut
	err := c.Run()
	if ctx.Err() != nil {
		return "", fmt.Errorf("%s: no answer within %s", c.Args[0], timeout)
	}
	if err != nil {
		msg := strings.TrimSpace(errOut.String())
		if msg == "" {
			msg = err.Error()
		}
		return out.String(), errors.New(lastLine(msg))
	}
	return out.String(), nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return strings.TrimSpace(s)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(line)
}

// rootEnv is the environment of the Slurm commands run as root.
func (r *Room) rootEnv() []string {
	env := []string{"PATH=" + os.Getenv("PATH")}
	return append(env, r.cfg.Env...)
}

// node is this node's Slurm name.
func (r *Room) node() string {
	if r.s.Node != "" {
		return r.s.Node
	}
	h, _ := os.Hostname()
	h, _, _ = strings.Cut(h, ".")
	return h
}

// The placeholder of a request: an allocation of its user on this node,
// for as many of the GRES as it wants. Where Slurm can allocate it now,
// salloc --no-shell --immediate makes it at once (an allocation is
// scheduled as it is asked for, as srun's is, and lives with no step but
// its extern step until it is cancelled or its time is up); where it
// cannot, sbatch queues it as a batch job that sleeps (a batch job is
// only ever started by the scheduler's next pass, up to a second or more
// later, which is why it is not the first try), and no process of the
// broker's waits meanwhile.

// placeholderArgs are the arguments of a placeholder for w common to
// salloc and sbatch; limit is w's time limit (0: Slurm's default), which
// Slurm takes in whole minutes.
func (r *Room) placeholderArgs(w *lease.Waiter, limit time.Duration) []string {
	name := "npurun-" + string(w.Kind)
	if w.Kind == lease.Task {
		name += "-" + strconv.FormatUint(w.Task, 10)
	}
	args := []string{"--job-name=" + name, "--gres=" + r.s.GRES + ":" + strconv.Itoa(w.N), "--nodelist=" + r.node(), "--ntasks=1"}
	if r.s.Partition != "" {
		args = append(args, "--partition="+r.s.Partition)
	}
	if limit > 0 {
		args = append(args, "--time="+strconv.FormatInt(int64((limit+time.Minute-1)/time.Minute), 10))
	}
	return args
}

// asUser prepares Slurm command name with args to run as w's user.
func (r *Room) asUser(w *lease.Waiter, name string, args ...string) (*exec.Cmd, error) {
	u, err := user.LookupId(strconv.FormatUint(uint64(w.UID), 10))
	if err != nil {
		return nil, fmt.Errorf("look up uid %d: %w", w.UID, err)
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append([]string{"HOME=" + u.HomeDir, "USER=" + u.Username, "LOGNAME=" + u.Username, "PATH=" + os.Getenv("PATH")}, r.cfg.Env...)
	switch {
	case os.Geteuid() == 0:
		gid, err := strconv.ParseUint(u.Gid, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("uid %d: group %q: %w", w.UID, u.Gid, err)
		}
		var groups []uint32
		if ids, err := u.GroupIds(); err == nil {
			for _, g := range ids {
				if n, err := strconv.ParseUint(g, 10, 32); err == nil {
					groups = append(groups, uint32(n))
				}
			}
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: w.UID, Gid: uint32(gid), Groups: groups}}
	case uint32(os.Geteuid()) != w.UID:
		return nil, fmt.Errorf("a broker not run as root submits for its own uid only, not uid %d", w.UID)
	}
	return cmd, nil
}

// errNotNow is salloc's refusal of an allocation Slurm cannot make now.
var errNotNow = errors.New("not allocated at once")

// salloc makes w's placeholder allocation (the arguments args) at once,
// as its user, if Slurm can (errNotNow if not), and returns its job id.
// salloc says the job's id as soon as it is allocated, then waits for
// the job's Prolog (which is the broker's to answer) before it exits: the
// id is taken as it is said, and salloc is left to end by itself, within
// submitTimeout.
func (r *Room) salloc(w *lease.Waiter, args []string) (uint32, error) {
	cmd, err := r.asUser(w, "salloc", append(slices.Clip(args), "--no-shell", "--immediate")...)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), submitTimeout)
	c := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	c.Env, c.Dir, c.SysProcAttr = cmd.Env, "/", cmd.SysProcAttr
	if c.SysProcAttr == nil {
		c.SysProcAttr = &syscall.SysProcAttr{}
	}
	c.SysProcAttr.Setsid = true
	c.WaitDelay = time.Second
	stderr, err := c.StderrPipe()
	if err != nil {
		cancel()
		return 0, err
	}
	if err := c.Start(); err != nil {
		cancel()
		return 0, err
	}
	lines := bufio.NewScanner(io.LimitReader(stderr, maxOutput))
	var id uint32
	for id == 0 && lines.Scan() {
		id = grantedJob(lines.Text())
	}
	go func() {
		defer cancel()
		io.Copy(io.Discard, io.LimitReader(stderr, maxOutput))
		c.Wait()
	}()
	if id == 0 {
		return 0, errNotNow
	}
	return id, nil
}

// grantedJob reads the job id of salloc's "salloc: Granted job
// allocation 123"; 0 for any other line.
func grantedJob(line string) uint32 {
	if _, rest, ok := strings.Cut(line, "Granted job allocation "); ok {
		if id, err := strconv.ParseUint(strings.TrimSpace(rest), 10, 32); err == nil {
			return uint32(id)
		}
	}
	return 0
}

// sbatch queues the placeholder allocation of waiter w, with the
// arguments common, as its user, and returns its job id.
func (r *Room) sbatch(w *lease.Waiter, common []string) (uint32, error) {
	args := append([]string{"--parsable"}, common...)
	args = append(args, "--output=/dev/null", "--error=/dev/null", "--wrap="+placeholderCommand)
	cmd, err := r.asUser(w, "sbatch", args...)
	if err != nil {
		return 0, err
	}
	out, err := r.run(cmd, submitTimeout)
	if err != nil {
		return 0, err
	}
	idText, _, _ := strings.Cut(strings.TrimSpace(out), ";")
	id, err := strconv.ParseUint(idText, 10, 32)
	if err != nil || id == 0 {
		return 0, fmt.Errorf("sbatch printed %q, not a job id", firstLine(out))
	}
	return uint32(id), nil
}

// squeue returns the state and reason of those of jobs ids that are in
// Slurm's queue.
func (r *Room) squeue(ids []uint32) (map[uint32]jobState, error) {
	list := make([]string, len(ids))
	for i, id := range ids {
		list[i] = strconv.FormatUint(uint64(id), 10)
	}
	path, err := exec.LookPath("squeue")
	if err != nil {
		return nil, err
	}
	out, err := r.run(exec.Command(path, "-h", "-o", "%i %T %r", "-j", strings.Join(list, ",")), pollTimeout)
	if err != nil {
		if strings.Contains(err.Error(), "Invalid job id") {
			return map[uint32]jobState{}, nil // none of them is known any more
		}
		return nil, err
	}
	return parseSqueue(out), nil
}

// scancel cancels job id.
func (r *Room) scancel(id uint32) error {
	path, err := exec.LookPath("scancel")
	if err != nil {
		return err
	}
	_, err = r.run(exec.Command(path, strconv.FormatUint(uint64(id), 10)), cancelTimeout)
	return err
}

// externStep matches the command line of a job's extern step daemon,
// "slurmstepd: [42.extern]".
var externStep = regexp.MustCompile(`^slurmstepd: \[([0-9]+)\.extern\]$`)

// ExternJob is the Slurm job whose extern step is the root process of
// command line cmdline ("slurmstepd: [42.extern]"), 0 for none.
func ExternJob(uid uint32, cmdline []string) uint32 {
	if uid != 0 || len(cmdline) == 0 {
		return 0
	}
	m := externStep.FindStringSubmatch(strings.TrimRight(cmdline[0], "\x00 "))
	if m == nil {
		return 0
	}
	id, err := strconv.ParseUint(m[1], 10, 32)
	if err != nil {
		return 0
	}
	return uint32(id)
}

// JobUser asks Slurm whose job id is (squeue, within pollTimeout).
func (r *Room) JobUser(id uint32) (uint32, string, error) {
	path, err := exec.LookPath("squeue")
	if err != nil {
		return 0, "", err
	}
	out, err := r.run(exec.Command(path, "-h", "-o", "%U %u", "-j", strconv.FormatUint(uint64(id), 10)), pollTimeout)
	if err != nil {
		return 0, "", fmt.Errorf("squeue -j %d: %w", id, err)
	}
	f := strings.Fields(firstLine(out))
	if len(f) != 2 {
		return 0, "", fmt.Errorf("squeue -j %d printed %q, not a job's uid and user", id, firstLine(out))
	}
	uid, err := strconv.ParseUint(f[0], 10, 32)
	if err != nil {
		return 0, "", fmt.Errorf("squeue -j %d printed %q, not a job's uid and user", id, firstLine(out))
	}
	return uint32(uid), f[1], nil
}
