// Package cluster speaks for Slurm on a login node: it submits, lists,
// holds, releases and cancels work through Slurm's own commands, with the
// one table (Args) that turns npurun's request into Slurm's options.
//
// Slurm's commands, not libslurm: libslurm's ABI changes with every
// release and needs cgo, while sbatch, srun, squeue, scontrol and scancel
// are what the site's Slurm already ships and keeps stable, run as the
// user, with Slurm's own authentication (munge). squeue --json is used
// for reading jobs (Debian 12's Slurm 22.05 has it: openapi/v0.0.38 and
// serializer/json ship with slurm-client; 22.05 applies none of squeue's
// filters to it, so the jobs are filtered here). scontrol has no --json
// in 22.05, and sacct needs accounting storage, which many small sites
// lack: a job is read from squeue --json while slurmctld keeps it
// (MinJobAge after its end), then from sacct where it is configured.
// squeue --start gives the estimated starts; sinfo the nodes.
//
// Errors: any command that fails is an *Error naming it and what it said;
// errors.Is(err, ErrUnavailable) where slurmctld did not answer (try
// again later). sbatch submits or does not (it prints the job id only
// once slurmctld recorded the job): Submit has the id or returns an error,
// and a submission is never half made.
package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/npurun/npurun/internal/clusterconf"
	"github.com/npurun/npurun/policy"
)

// ErrUnavailable: Slurm's controller did not answer; the same request may
// succeed later.
var ErrUnavailable = errors.New("slurm's controller does not answer")

// Error is a Slurm command that failed.
type Error struct {
	Command string // "sbatch"
	Msg     string // what it said, its last line
	Down    bool   // slurmctld did not answer
}

func (e *Error) Error() string { return e.Command + ": " + e.Msg }

// Is makes errors.Is(err, ErrUnavailable) true for a controller down.
func (e *Error) Is(target error) bool { return target == ErrUnavailable && e.Down }

// Slurm runs Slurm's commands for one login configuration.
type Slurm struct {
	Conf    policy.Cluster
	Notify  string        // the notify command of a task that names none: the login configuration's [tasks] notify
	Env     []string      // the commands' environment; nil: this process's
	Timeout time.Duration // each command's; 0: DefaultTimeout
}

// DefaultTimeout bounds one Slurm command (its own retries to a
// controller that does not answer take about a minute).
const DefaultTimeout = 90 * time.Second

// Request is what npurun or task-submit asks for.
type Request struct {
	N       int      // devices (GRES count); 0: none
	Mem     int64    // a share of a device, MiB; 0: whole devices
	TimeSec int64    // time limit; 0: the partition's
	After   []uint64 // jobs that must succeed first
	Name    string   // the job's name; "" for the command's first word
	Pool    string   // partition; "" for the configured one or Slurm's default
	CPUs    int      // CPUs per task; 0: Slurm's default
	Hold    bool     // submit held
	Log     string   // output file; "" for Slurm's default (slurm-%j.out in the working directory)
	Command string   // the command line, for the job's comment (what list shows)
	Notify  string   // a command line run once the command has ended (notifyScript); "" for none
	Token   string   // names the submission (the job's comment keeps it): ByToken finds its job
}

// Args is the one table from a request to Slurm's options, the same for
// sbatch and srun. The environment and the working directory are
// sbatch's and srun's own defaults (--export=ALL, the directory they run
// in): the caller runs them in the user's.
func (s *Slurm) Args(r *Request) ([]string, error) {
	var a []string
	gres := s.Conf.GRES
	switch {
	case r.Mem > 0 && s.Conf.Shares == policy.SharesNone:
		return nil, fmt.Errorf("--mem asks for a share of a device, and this cluster's nodes take whole devices only ([cluster] shares = %q)", s.Conf.Shares)
	case r.Mem > 0 && s.Conf.Shares == policy.SharesNpurun:
		// No GRES: the node's npurun takes the share (Command).
	case r.Mem > 0 && r.N > 1:
		return nil, fmt.Errorf("--mem through Slurm is a share of one device (Slurm's shards are of one device), not of %d", r.N)
	case r.Mem > 0:
		k := (r.Mem + s.Conf.ShardMem - 1) / s.Conf.ShardMem
		a = append(a, "--gres=shard:"+strconv.FormatInt(k, 10))
	case r.N > 0:
		a = append(a, "--gres="+gres+":"+strconv.Itoa(r.N))
	}
	if r.TimeSec > 0 {
		a = append(a, "--time="+strconv.FormatInt((r.TimeSec+59)/60, 10)) // minutes, rounded up
	}
	if len(r.After) > 0 {
		ids := make([]string, len(r.After))
		for i, id := range r.After {
			ids[i] = strconv.FormatUint(id, 10)
		}
		a = append(a, "--dependency=afterok:"+strings.Join(ids, ":"), "--kill-on-invalid-dep=yes")
	}
	switch {
	case r.Name != "":
		a = append(a, "--job-name="+r.Name)
	case FirstWord(r.Command) != "":
		a = append(a, "--job-name="+FirstWord(r.Command))
	}
	switch {
	case r.Pool != "":
		a = append(a, "--partition="+r.Pool)
	case s.Conf.Partition != "":
		a = append(a, "--partition="+s.Conf.Partition)
	}
	if r.CPUs > 0 {
		a = append(a, "--cpus-per-task="+strconv.Itoa(r.CPUs))
	}
	if r.Hold {
		a = append(a, "--hold")
	}
	if r.Log != "" {
		a = append(a, "--output="+r.Log)
	}
	if r.Command != "" || r.Token != "" {
		a = append(a, "--comment="+commentOf(r))
	}
	return a, nil
}

// Command is what the job runs for argv: argv itself, or, where --mem is
// a share of the nodes' own npurun devices ([cluster] shares =
// "npurun"), npurun --mem on the node (the one of the job's PATH), which
// waits for its broker's share there and becomes argv.
func (s *Slurm) Command(r *Request, argv []string) []string {
	if r.Mem <= 0 || s.Conf.Shares != policy.SharesNpurun {
		return argv
	}
	w := []string{"npurun", "--mem=" + strconv.FormatInt(r.Mem, 10) + "M"}
	if r.N > 0 {
		w = append(w, "-n", strconv.Itoa(r.N))
	}
	return append(append(w, "--"), argv...)
}

// maxComment bounds the command kept in a job's comment.
const maxComment = 1000

// A job's comment is its command line after what Slurm's own record of
// the job does not keep of the request, each a word "npurun-KEY=VALUE ":
// the submission's token (ByToken), and a share's memory in MiB and its
// device count (a shard job's GRES counts shards; a job of the nodes'
// own npurun shares has none).
const (
	commentMark  = "npurun-"
	commentToken = "token"
	commentMem   = "mem"
	commentN     = "n"
)

// commentOf is r's comment: its command line, after its token and share
// if it has them; one line, bounded.
func commentOf(r *Request) string {
	var b strings.Builder
	word := func(key, value string) { b.WriteString(commentMark + key + "=" + value + " ") }
	if r.Token != "" {
		word(commentToken, r.Token)
	}
	if r.Mem > 0 {
		word(commentMem, strconv.FormatInt(r.Mem, 10))
		word(commentN, strconv.Itoa(max(r.N, 1)))
	}
	b.WriteString(strings.Join(strings.Fields(r.Command), " "))
	cmd := b.String()
	if len(cmd) > maxComment {
		cmd = cmd[:maxComment]
	}
	return cmd
}

// readComment fills j's command, token and share from its comment.
func (j *Job) readComment(comment string) {
	for strings.HasPrefix(comment, commentMark) {
		var w string
		w, comment, _ = strings.Cut(comment, " ")
		key, value, _ := strings.Cut(strings.TrimPrefix(w, commentMark), "=")
		switch key {
		case commentToken:
			j.Token = value
		case commentMem:
			j.Mem, _ = strconv.ParseInt(value, 10, 64)
		case commentN:
			j.MemN, _ = strconv.Atoi(value)
		}
	}
	j.Command = comment
}

// ByToken is the caller's job whose submission token was token, while
// slurmctld keeps it (MinJobAge after its end), or nil. Two submissions
// with one token are one job where the second asks after the first has
// its id: the caller serialises its own.
func (s *Slurm) ByToken(token string) (*Job, error) {
	jobs, err := s.Jobs()
	if err != nil {
		return nil, err
	}
	uid := uint32(os.Getuid())
	for i := range jobs {
		if jobs[i].Token == token && jobs[i].UID == uid {
			return &jobs[i], nil
		}
	}
	return nil, nil
}

// Bin is the path of Slurm's command name.
func (s *Slurm) Bin(name string) string {
	if s.Conf.Bin != "" {
		return filepath.Join(s.Conf.Bin, name)
	}
	return name
}

// run runs Slurm's command name and returns its standard output.
func (s *Slurm) run(dir, name string, args ...string) ([]byte, error) {
	timeout := s.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	stdout, stderr, ws, err := output(s.Bin(name), append([]string{name}, args...), s.Env, dir, timeout)
	switch {
	case err == errTimedOut:
		return nil, &Error{Command: name, Msg: "no answer within " + timeout.String(), Down: true}
	case err == errTooLong:
		return nil, &Error{Command: name, Msg: fmt.Sprintf("answered more than %d MiB", maxStdout>>20)}
	case err != nil:
		return nil, s.startError(name, err)
	case ws.Exited() && ws.ExitStatus() == 0:
		return stdout, nil
	}
	return nil, commandError(name, string(stderr))
}

// commandError reads what a failed Slurm command said.
func commandError(name, said string) *Error {
	said = strings.TrimSpace(said)
	lines := strings.Split(said, "\n")
	msg := strings.TrimSpace(lines[len(lines)-1])
	for _, l := range lines { // the first error line says most
		if strings.Contains(l, "error:") {
			msg = strings.TrimSpace(l)
			break
		}
	}
	msg = strings.TrimPrefix(msg, name+": ")
	msg = strings.TrimPrefix(msg, "error: ")
	if msg == "" {
		msg = "failed, saying nothing"
	}
	lower := strings.ToLower(said)
	down := strings.Contains(lower, "unable to contact slurm controller") ||
		strings.Contains(lower, "connection refused") ||
		strings.Contains(lower, "socket timed out") ||
		strings.Contains(lower, "slurm_persist_conn_open") ||
		strings.Contains(lower, "could not establish a configuration source") ||
		strings.Contains(lower, "unable to establish controller")
	return &Error{Command: name, Msg: msg, Down: down}
}

// Submit submits a batch job running shell (a command line for /bin/sh)
// in dir, as the caller, with the caller's environment: the job's id and
// partition, or an error and no job.
func (s *Slurm) Submit(r *Request, dir, shell string) (uint64, string, error) {
	args, err := s.Args(r)
	if err != nil {
		return 0, "", err
	}
	args = append([]string{"--parsable"}, args...)
	if w := s.Command(r, []string{"/bin/sh", "-c", shell}); w[0] != "/bin/sh" {
		shell = "exec " + ShellJoin(w)
	}
	if r.Notify != "" {
		shell = notifyScript(shell, r.Notify, r.Name, r.Log)
	}
	args = append(args, "--wrap="+shell)
	out, err := s.run(dir, "sbatch", args...)
	if err != nil {
		return 0, "", err
	}
	// --parsable: "ID" or "ID;CLUSTER".
	idText, _, _ := strings.Cut(strings.TrimSpace(string(out)), ";")
	id, perr := strconv.ParseUint(idText, 10, 64)
	if perr != nil || id == 0 {
		return 0, "", &Error{Command: "sbatch", Msg: fmt.Sprintf("unexpected answer %q", strings.TrimSpace(string(out)))}
	}
	partition := r.Pool
	if partition == "" {
		partition = s.Conf.Partition
	}
	if partition == "" { // Slurm's default: ask, but a submission stands whatever the answer
		if j, err := s.Job(id); err == nil {
			partition = j.Partition
		}
	}
	return id, partition, nil
}

// Cancel cancels job id (scancel).
func (s *Slurm) Cancel(id uint64) error {
	_, err := s.run("", "scancel", strconv.FormatUint(id, 10))
	return err
}

// Hold keeps job id from starting; Release lets it start again.
func (s *Slurm) Hold(id uint64) error {
	_, err := s.run("", "scontrol", "hold", strconv.FormatUint(id, 10))
	return err
}

func (s *Slurm) Release(id uint64) error {
	_, err := s.run("", "scontrol", "release", strconv.FormatUint(id, 10))
	return err
}

// Ping tells whether slurmctld answers.
func (s *Slurm) Ping() error {
	out, err := s.run("", "scontrol", "ping")
	if err != nil {
		return err
	}
	if !strings.Contains(string(out), "is UP") {
		return &Error{Command: "scontrol ping", Msg: strings.TrimSpace(string(out)), Down: true}
	}
	return nil
}

// Job states as Slurm names them (a few).
const (
	StatePending   = "PENDING"
	StateRunning   = "RUNNING"
	StateCompleted = "COMPLETED"
	StateFailed    = "FAILED"
	StateCancelled = "CANCELLED"
)

// Job is one Slurm job as squeue --json gives it.
type Job struct {
	ID        uint64
	User      string
	UID       uint32
	Name      string
	State     string // PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL …
	Reason    string // why it waits or ended: Priority, Resources, JobHeldUser …
	Node      string // nodes, compressed ("n1", "n[1-2]"); "" while waiting
	Devices   []int  // GRES indices on the node
	GRES      string // what it asked for: "gpu:2"
	Partition string
	Command   string // the comment npurun gave it, else Slurm's command
	Token     string // the token of its submission, kept in its comment
	Mem       int64  // a share's memory of each device, MiB, kept in its comment; 0: whole devices
	MemN      int    // with Mem: the devices it shares
	Cwd       string
	Output    string // the output file, its %j, %u, %x, %N, %% expanded
	Submitted time.Time
	Started   time.Time // zero while waiting
	Ended     time.Time // zero while not ended
	Status    int       // a wait status (exit << 8 | signal), once ended
	TimeSec   int64     // its time limit; 0: none
	Priority  int64
	Held      bool
	Depends   string
}

// Ended tells whether the job is over.
func (j *Job) Over() bool {
	switch j.State {
	case StatePending, StateRunning, "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD":
		return false
	}
	return true
}

// ExitStatus is the shell's status of an ended job: its exit code, or
// 128+N for a signal N.
func (j *Job) ExitStatus() int {
	ws := syscall.WaitStatus(j.Status)
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// Signal is the signal that ended the job, or 0.
func (j *Job) Signal() syscall.Signal {
	ws := syscall.WaitStatus(j.Status)
	if ws.Signaled() {
		return ws.Signal()
	}
	return 0
}

// squeueJSON is what is read of squeue --json (openapi v0.0.38).
type squeueJSON struct {
	Errors []struct {
		Error       string `json:"error"`
		Description string `json:"description"`
	} `json:"errors"`
	Jobs []struct {
		JobID      uint64   `json:"job_id"`
		UserName   string   `json:"user_name"`
		UserID     uint32   `json:"user_id"`
		Name       string   `json:"name"`
		JobState   string   `json:"job_state"`
		Reason     string   `json:"state_reason"`
		Nodes      string   `json:"nodes"`
		GresDetail []string `json:"gres_detail"`
		TresPer    string   `json:"tres_per_node"`
		Partition  string   `json:"partition"`
		Comment    string   `json:"comment"`
		Command    string   `json:"command"`
		Cwd        string   `json:"current_working_directory"`
		Stdout     string   `json:"standard_output"`
		Submit     int64    `json:"submit_time"`
		Start      int64    `json:"start_time"`
		End        int64    `json:"end_time"`
		ExitCode   int      `json:"exit_code"`
		TimeLimit  int64    `json:"time_limit"` // minutes
		Priority   int64    `json:"priority"`
		Dependency string   `json:"dependency"`
	} `json:"jobs"`
}

// Jobs are the jobs slurmctld knows: waiting, running, and those ended
// within its MinJobAge.
func (s *Slurm) Jobs() ([]Job, error) {
	out, err := s.run("", "squeue", "--json")
	if err != nil {
		return nil, err
	}
	return parseJobs(out)
}

func parseJobs(data []byte) ([]Job, error) {
	var q squeueJSON
	if err := json.Unmarshal(data, &q); err != nil {
		return nil, &Error{Command: "squeue --json", Msg: "unreadable answer: " + err.Error()}
	}
	if len(q.Errors) > 0 {
		return nil, &Error{Command: "squeue --json", Msg: q.Errors[0].Error + " " + q.Errors[0].Description}
	}
	jobs := make([]Job, 0, len(q.Jobs))
	for _, r := range q.Jobs {
		j := Job{ID: r.JobID, User: r.UserName, UID: r.UserID, Name: r.Name, State: r.JobState, Reason: r.Reason,
			Node: r.Nodes, Partition: r.Partition, Cwd: r.Cwd, Priority: r.Priority, Depends: r.Dependency,
			Status: r.ExitCode, Submitted: unix(r.Submit)}
		if j.Reason == "None" {
			j.Reason = ""
		}
		j.Held = j.State == StatePending && (j.Priority == 0 || strings.HasPrefix(j.Reason, "JobHeld"))
		j.GRES = strings.TrimPrefix(r.TresPer, "gres:")
		for _, d := range r.GresDetail {
			if _, idx, ok := strings.Cut(d, "(IDX:"); ok {
				j.Devices = append(j.Devices, parseIndices(strings.TrimSuffix(idx, ")"))...)
			}
		}
		j.readComment(r.Comment)
		if j.Command == "" {
			j.Command = r.Command
		}
		if j.State != StatePending && r.Nodes != "" { // a job cancelled while it waited has a start time, and no node
			j.Started = unix(r.Start)
		}
		if j.Over() {
			j.Ended = unix(r.End)
		}
		if r.TimeLimit > 0 && r.TimeLimit < 1<<31 {
			j.TimeSec = r.TimeLimit * 60
		}
		j.Output = expandOutput(r.Stdout, &j)
		jobs = append(jobs, j)
	}
	sort.Slice(jobs, func(a, b int) bool { return jobs[a].ID < jobs[b].ID })
	return jobs, nil
}

func unix(sec int64) time.Time {
	if sec <= 0 {
		return time.Time{}
	}
	return time.Unix(sec, 0)
}

// parseIndices reads "0-1,3".
func parseIndices(s string) []int {
	var ids []int
	for _, part := range strings.Split(s, ",") {
		a, b, isRange := strings.Cut(part, "-")
		lo, err := strconv.Atoi(a)
		if err != nil {
			continue
		}
		hi := lo
		if isRange {
			if hi, err = strconv.Atoi(b); err != nil || hi < lo || hi-lo > 1024 {
				continue
			}
		}
		for i := lo; i <= hi; i++ {
			ids = append(ids, i)
		}
	}
	return ids
}

// expandOutput expands the patterns of an output file name that a login
// node can know (%j, %A, %u, %x, %N, %n of node 0, %%); "" for Slurm's
// default, slurm-%j.out in the working directory.
func expandOutput(pattern string, j *Job) string {
	if pattern == "" {
		if j.Cwd == "" {
			return ""
		}
		return filepath.Join(j.Cwd, "slurm-"+strconv.FormatUint(j.ID, 10)+".out")
	}
	var b strings.Builder
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		if c != '%' || i+1 == len(pattern) {
			b.WriteByte(c)
			continue
		}
		i++
		switch pattern[i] {
		case 'j', 'A':
			b.WriteString(strconv.FormatUint(j.ID, 10))
		case 'u':
			b.WriteString(j.User)
		case 'x':
			b.WriteString(j.Name)
		case 'N':
			b.WriteString(j.Node)
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(pattern[i])
		}
	}
	p := b.String()
	if !filepath.IsAbs(p) && j.Cwd != "" {
		p = filepath.Join(j.Cwd, p)
	}
	return p
}

// ErrNoJob: Slurm does not know the job (never was, or ended long ago).
var ErrNoJob = errors.New("no such job")

// Job is one job, from squeue --json, else sacct where accounting keeps
// it.
func (s *Slurm) Job(id uint64) (*Job, error) {
	jobs, err := s.Jobs()
	if err != nil {
		return nil, err
	}
	for i := range jobs {
		if jobs[i].ID == id {
			return &jobs[i], nil
		}
	}
	if j, err := s.accounted(id); err == nil {
		return j, nil
	}
	return nil, fmt.Errorf("job %d: %w", id, ErrNoJob)
}

// accounted reads an ended job from sacct (where accounting storage is
// configured; an error otherwise).
func (s *Slurm) accounted(id uint64) (*Job, error) {
	out, err := s.run("", "sacct", "-n", "-P", "-X", "-j", strconv.FormatUint(id, 10),
		"-o", "JobID,User,UID,JobName,State,NodeList,Partition,WorkDir,Submit,Start,End,ExitCode")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) < 12 || f[0] != strconv.FormatUint(id, 10) {
			continue
		}
		uid, _ := strconv.ParseUint(f[2], 10, 32)
		state, _, _ := strings.Cut(f[4], " ") // "CANCELLED by 0"
		j := &Job{ID: id, User: f[1], UID: uint32(uid), Name: f[3], State: state, Node: f[5], Partition: f[6], Cwd: f[7]}
		j.Submitted, j.Started, j.Ended = sacctTime(f[8]), sacctTime(f[9]), sacctTime(f[10])
		code, sig, _ := strings.Cut(f[11], ":")
		c, _ := strconv.Atoi(code)
		n, _ := strconv.Atoi(sig)
		j.Status = c<<8 | n&0x7f
		if n != 0 {
			j.Status = n & 0x7f
		}
		j.Output = expandOutput("", j)
		return j, nil
	}
	return nil, ErrNoJob
}

func sacctTime(s string) time.Time {
	t, err := time.ParseInLocation("2006-01-02T15:04:05", s, time.Local)
	if err != nil {
		return time.Time{}
	}
	return t
}

// Start is a waiting job's estimated start, from squeue --start.
type Start struct {
	At     time.Time // zero: unknown
	Reason string
}

// Starts are the estimated starts of the waiting jobs.
func (s *Slurm) Starts() (map[uint64]Start, error) {
	out, err := s.run("", "squeue", "--start", "-h", "-o", "%i|%S|%r")
	if err != nil {
		return nil, err
	}
	starts := map[uint64]Start{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "|", 3)
		if len(f) < 3 {
			continue
		}
		id, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		st := Start{Reason: f[2]}
		if t, err := time.ParseInLocation("2006-01-02T15:04:05", f[1], time.Local); err == nil {
			st.At = t
		}
		starts[id] = st
	}
	return starts, nil
}

// Node is one node as sinfo gives it.
type Node struct {
	Name      string
	State     string // idle, mixed, allocated, down, drained …
	Reason    string
	Partition string
	GRES      string // configured: "gpu:4"
	Used      string // allocated: "gpu:2(IDX:0-1)"
}

// Down tells whether the node takes no work.
func (n *Node) Down() bool {
	s := strings.TrimRight(n.State, "*~#!%$@^-")
	return strings.HasPrefix(s, "down") || strings.HasPrefix(s, "drain") || strings.HasPrefix(s, "fail") || strings.HasSuffix(n.State, "*")
}

// Nodes are the cluster's nodes, each once.
func (s *Slurm) Nodes() ([]Node, error) {
	out, err := s.run("", "sinfo", "-h", "-N", "-O", "NodeList:|,StateLong:|,Partition:|,Gres:|,GresUsed:|,Reason:")
	if err != nil {
		return nil, err
	}
	return parseNodes(out), nil
}

func parseNodes(out []byte) []Node {
	seen := map[string]bool{}
	var nodes []Node
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "|", 6)
		if len(f) < 6 {
			continue
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		if seen[f[0]] {
			continue
		}
		seen[f[0]] = true
		n := Node{Name: f[0], State: f[1], Partition: strings.TrimSuffix(f[2], "*"), GRES: f[3], Used: f[4], Reason: f[5]}
		if n.Reason == "none" {
			n.Reason = ""
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// Place is a waiting job's place in its partition's line: 1 for the
// next, by priority then id (held jobs behind none); 0 where it does not
// wait.
func Place(jobs []Job, id uint64) int { return Places(jobs)[id] }

// Places are the waiting jobs' places (Place), all at once: each
// partition's line sorted once.
func Places(jobs []Job) map[uint64]int {
	ahead := func(a, b *Job) bool { return a.Priority > b.Priority || a.Priority == b.Priority && a.ID < b.ID }
	lines := map[string][]*Job{} // each partition's waiting jobs that are not held, first first
	for i := range jobs {
		if j := &jobs[i]; j.State == StatePending && !j.Held {
			lines[j.Partition] = append(lines[j.Partition], j)
		}
	}
	for _, line := range lines {
		sort.Slice(line, func(a, b int) bool { return ahead(line[a], line[b]) })
	}
	places := map[uint64]int{}
	for i := range jobs {
		me := &jobs[i]
		if me.State != StatePending {
			continue
		}
		line := lines[me.Partition]
		n := sort.Search(len(line), func(k int) bool { return !ahead(line[k], me) || line[k] == me })
		places[me.ID] = n + 1
	}
	return places
}

// ShellJoin is argv as one command line for /bin/sh, each word quoted
// where it needs to be.
func ShellJoin(argv []string) string {
	words := make([]string, len(argv))
	for i, w := range argv {
		if w != "" && strings.IndexFunc(w, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
		}) < 0 {
			words[i] = w
			continue
		}
		words[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return strings.Join(words, " ")
}

// Load is the Slurm of the configuration at path when it has a [cluster]
// table; nil, nil when it has none, there is no file or the caller may
// not read it (work goes to this machine's broker). A file that cannot be
// read for another reason, or does not parse, is an error.
func Load(path string) (*Slurm, error) {
	data, has, err := clusterconf.Read(path) // the test npurun makes (shim)
	if err != nil || !has {
		return nil, err // no [cluster], the common case, without parsing
	}
	c, err := policy.Parse(path, data)
	if err != nil {
		return nil, err
	}
	if !c.Cluster.Active() {
		return nil, nil
	}
	return &Slurm{Conf: c.Cluster, Notify: c.Tasks.Notify}, nil
}

// FirstWord is the first word of a command line: the name Slurm gives a
// job without one is "wrap"; npurun names it by its command instead.
func FirstWord(cmd string) string {
	f := strings.Fields(cmd)
	if len(f) == 0 {
		return ""
	}
	return filepath.Base(f[0])
}
