// Command workload is the job the end-to-end tests run under npurun: it
// proves its own exclusivity with an O_EXCL marker per device it was given
// and records what it saw.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
	_ "github.com/npurun/npurun/wire/jsoncodec" // messages beyond the lease exchange
)

func main() {
	if filepath.Base(os.Args[0]) == wire.SupervisorName {
		slowSupervisor() // see slowsup.go
		return
	}
	if standInName() {
		standIn()
		return
	}
	markers := flag.String("markers", "", "directory of per-device O_EXCL markers")
	logFile := flag.String("log", "", "file to append one line per run to")
	tag := flag.String("tag", "", "name of this run in the log")
	hold := flag.Duration("hold", 0, "how long to hold the devices")
	relock := flag.Bool("relock", false, "play a client that keeps its lease's descriptor: unlock it, then block in flock on it again until standard input closes")
	ask := flag.String("ask", "", "send one request with this op, naming -user, to the broker at $NPURUN_SOCKET and print the reply")
	askUser := flag.String("user", "", "the user an -ask request names")
	pass := flag.String("pass", "", "send the lease's first descriptor over the Unix socket at this path, then exit")
	receive := flag.String("receive", "", "listen on this Unix socket path, take a descriptor sent there and keep it until standard input closes")
	receiveLaterPath := flag.String("receive-later", "", "listen on this Unix socket path and accept a connection, but read nothing (a descriptor sent there stays in flight) until a line comes on standard input; then take the descriptor, put it at 20 or above, and run the command after the flags with NPURUN_LEASE naming it as device -lease-device's")
	leaseDevice := flag.Int("lease-device", 0, "with -receive-later: the device NPURUN_LEASE names")
	ignoreTerm := flag.Bool("ignore-term", false, "ignore SIGTERM (with -receive: a holder that only SIGKILL ends)")
	escape := flag.String("escape", "", "leave the task's reach as a job could: setpgid (a process group of its own), setsid (a session of its own), or daemon (a child in a session of its own, orphaned at once); then write the pid to -pidfile and hold the lease for -hold")
	pidfile := flag.String("pidfile", "", "with -escape: where to write the escaped process's pid (a FIFO, say)")
	floodMode := flag.String("flood", "", "attack the broker at $NPURUN_SOCKET until standard input closes: fill, list, churn, oversize or idle (see flood.go)")
	conns := flag.Int("conns", 1, "with -flood: connections")
	count := flag.Int("n", 0, "with -flood fill: tasks")
	mmapNode := flag.String("mmap", "", "map this device node, close its descriptor and keep the mapping until standard input closes (see hide.go)")
	dups := flag.Int("dups", 0, "put this many copies of standard input at descriptors 100 and up, then become sleep 600")
	root := flag.Bool("become-root", false, "as a set-user-ID copy owned by root: make every uid root's, then become sleep 600")
	nSessions := flag.Int("sessions", -1, "ask for this many login sessions of its own, each ended at once (see sessions.go); with -hold, keep one more")
	origin := flag.String("origin", "", "with -sessions: the sessions' SERVICE,TTY,RHOST")
	containSpec := flag.String("contain", "", "tell the broker that container ENGINE/ID/NAME holds the lease of NPURUN_LEASE, as npurun-runtime does (op container), print its answer, and hold the lease until standard input closes (see contain.go)")
	containFile := flag.String("contain-file", "", "with -contain: send this file's descriptor in place of the lease's first")
	containNone := flag.Bool("contain-none", false, "with -contain: send no descriptor")
	containOwner := flag.String("contain-owner", "", "with -contain: the user whose lease it must be, as root's runtime names the hand-over's peer")
	mem := flag.Int64("mem", 0, "with -markers: a share of this many MiB of each device; the run checks, in the markers, that the shares running on its devices declare no more than -capacity together (see share.go)")
	capacity := flag.Int64("capacity", 0, "with -mem: what the shares of a device may declare together, in MiB")
	waitStdin := flag.Bool("wait-stdin", false, "once the devices are marked, say \"running TAG\" and hold them until standard input closes (then -hold more)")
	squatAddr := flag.String("squat", "", "bind this hand-over address and answer runtimes with the lease of NPURUN_LEASE until standard input closes (see squat.go)")
	once := flag.String("once", "", "mark this run with a file made O_EXCL at this path; if it exists (this is a second run), make PATH.twice.PID and exit 3")
	flag.Parse()
	if os.Geteuid() != os.Getuid() && !*root {
		fail("set-user-ID", fmt.Errorf("a set-user-ID copy does -become-root only"))
	}
	if *ignoreTerm {
		signal.Ignore(syscall.SIGTERM)
	}
	switch {
	case *nSessions >= 0:
		sessions(*nSessions, *origin, *hold > 0)
		return
	case *mmapNode != "":
		mapNode(*mmapNode)
		return
	case *dups > 0:
		dupDescriptors(*dups)
		return
	case *root:
		becomeRoot()
		return
	case *floodMode != "":
		flood(*floodMode, *conns, *count)
		return
	case *escape != "":
		escapeTask(*escape, *pidfile, *hold)
		return
	case *ask != "":
		askBroker(*ask, *askUser)
		return
	case *squatAddr != "":
		squat(*squatAddr)
		return
	case *containSpec != "":
		contain(*containSpec, *containFile, *containNone, *containOwner)
		return
	case *relock:
		relockLease()
		return
	case *pass != "":
		passLease(*pass)
		return
	case *receive != "":
		receiveLease(*receive)
		return
	case *receiveLaterPath != "":
		receiveLater(*receiveLaterPath, *leaseDevice, flag.Args())
		return
	}

	if *once != "" {
		markOnce(*once)
	}
	devs := os.Getenv("NPURUN_DEVICES")
	start := time.Now().UnixNano()
	var made []string
	if *mem > 0 && *markers != "" && devs != "" {
		made = markShares(*markers, *tag, devs, *mem, *capacity)
	} else if *markers != "" && devs != "" {
		made = markWhole(*markers, *tag, devs)
	}
	if *waitStdin {
		fmt.Println("running", *tag)
		io.Copy(io.Discard, os.Stdin)
	}
	time.Sleep(*hold)
	for _, p := range made {
		os.Remove(p)
	}
	if *logFile != "" {
		f, err := os.OpenFile(*logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o666)
		if err != nil {
			fmt.Fprintln(os.Stderr, "workload:", err)
			os.Exit(4)
		}
		// One write per line: O_APPEND keeps concurrent lines whole.
		fmt.Fprintf(f, "%s %d %d %s %s\n", *tag, start, time.Now().UnixNano(), strconv.Itoa(os.Getuid()), devs)
		f.Close()
	}
}

// markOnce makes the marker of this run at path, O_EXCL: the workload
// itself counts its runs, not the broker. One that exists means that the
// command ran before: it leaves path.twice.PID beside it and exits 3.
func markOnce(path string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if errors.Is(err, os.ErrExist) {
		twice := fmt.Sprintf("%s.twice.%d", path, os.Getpid())
		if err := os.WriteFile(twice, nil, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "workload:", err)
		}
		fmt.Fprintln(os.Stderr, "workload: RAN TWICE:", path)
		os.Exit(3)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(4)
	}
	f.Close()
}

// relockLease unlocks the lease's first descriptor (ending the lease, as
// far as the broker can tell) and says "unlocked"; once a byte comes on its
// standard input it waits in flock on the same descriptor, says "relocked"
// once it has the lock, and holds it until its standard input closes.
func relockLease() {
	dev, fdText, _ := strings.Cut(strings.Split(os.Getenv("NPURUN_LEASE"), ",")[0], ":")
	fd, err := strconv.Atoi(fdText)
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload: no lease descriptor in NPURUN_LEASE")
		os.Exit(4)
	}
	if err := unix.Flock(fd, unix.LOCK_UN); err != nil {
		fmt.Fprintln(os.Stderr, "workload: unlock:", err)
		os.Exit(4)
	}
	fmt.Println("unlocked npu" + dev)
	// Told when the broker has seen the lease end (its device free again),
	// wait in flock on the kept descriptor.
	if _, err := os.Stdin.Read(make([]byte, 1)); err != nil {
		fmt.Fprintln(os.Stderr, "workload: read:", err)
		os.Exit(4)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		fmt.Fprintln(os.Stderr, "workload: lock:", err)
		os.Exit(4)
	}
	fmt.Println("relocked npu" + dev)
	io.Copy(io.Discard, os.Stdin)
}

// askBroker sends one request naming user and prints the reply's type, or
// the error's code and message.
func askBroker(op, user string) {
	c, err := wire.Dial(wire.SocketPath(""))
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(4)
	}
	defer c.Close()
	if err := c.Send(&wire.Request{Op: op, User: user, Login: op == wire.OpSession}); err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(4)
	}
	r, _, err := c.Recv(10 * time.Second)
	var be *wire.Error
	switch {
	case errors.As(err, &be):
		fmt.Printf("%s: %s\n", be.Code, be.Message)
	case err != nil:
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(4)
	default:
		fmt.Println(r.Type)
	}
}

// passLease sends the lease's first descriptor to the process listening at
// path: the lease goes on in a process that is no descendant of npurun's.
func passLease(path string) {
	_, fdText, _ := strings.Cut(strings.Split(os.Getenv("NPURUN_LEASE"), ",")[0], ":")
	fd, err := strconv.Atoi(fdText)
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload: no lease descriptor in NPURUN_LEASE")
		os.Exit(4)
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(4)
	}
	if _, _, err := c.WriteMsgUnix([]byte("lease"), unix.UnixRights(fd), nil); err != nil {
		fmt.Fprintln(os.Stderr, "workload: send:", err)
		os.Exit(4)
	}
	c.Close()
	fmt.Println("passed")
}

// receiveLease says "listening", takes one descriptor sent to path, says
// "received", and keeps it until its standard input closes.
func receiveLease(path string) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(4)
	}
	os.Chmod(path, 0o777) // a sender of another user may connect
	fmt.Println("listening")
	c, err := ln.AcceptUnix()
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(4)
	}
	buf, oob := make([]byte, 16), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload: receive:", err)
		os.Exit(4)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		fmt.Fprintln(os.Stderr, "workload: no descriptor came")
		os.Exit(4)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		fmt.Fprintln(os.Stderr, "workload: no descriptor came")
		os.Exit(4)
	}
	c.Close()
	ln.Close()
	fmt.Printf("received %d\n", fds[0])
	os.Stdin.Read(make([]byte, 1))
}

// receiveLater plays a process outside a lease that a descriptor was sent
// to and that does not read it: it says "listening", accepts a
// connection at path and says "accepted", then reads nothing until a line
// comes on its standard input. Then it takes the descriptor, says
// "received FD" (FD: where it put it, 20 or above, close-on-exec clear),
// and runs argv with NPURUN_LEASE=DEVICE:FD, as a process of a lease
// would (a nested npurun presents it).
func receiveLater(path string, device int, argv []string) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		fail("listen", err)
	}
	os.Chmod(path, 0o777) // a sender of another user may connect
	fmt.Println("listening")
	c, err := ln.AcceptUnix()
	if err != nil {
		fail("accept", err)
	}
	fmt.Println("accepted")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fail("wait for the word to read", err)
	}
	buf, oob := make([]byte, 16), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		fail("receive", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		fail("receive", fmt.Errorf("no descriptor came"))
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		fail("receive", fmt.Errorf("no descriptor came"))
	}
	fd, err := unix.FcntlInt(uintptr(fds[0]), unix.F_DUPFD, 20) // close-on-exec clear
	if err != nil {
		fail("place the descriptor", err)
	}
	fmt.Printf("received %d\n", fd)
	if len(argv) == 0 {
		os.Stdin.Read(make([]byte, 1))
		return
	}
	path, err = exec.LookPath(argv[0])
	if err != nil {
		fail("run", err)
	}
	env := append(os.Environ(), fmt.Sprintf("NPURUN_LEASE=%d:%d", device, fd))
	fail("run", syscall.Exec(path, argv, env))
}

// escapeTask plays a job that tries to outlive its task: it leaves the
// task's process group or session, or forks a child that does and exits at
// once (a daemon's double fork, its child handed to a subreaper or init).
// The process that escaped writes its pid to pidfile and holds whatever it
// inherited (a lease's descriptors) for hold.
func escapeTask(mode, pidfile string, hold time.Duration) {
	switch mode {
	case "setpgid":
		if err := syscall.Setpgid(0, 0); err != nil {
			fail("setpgid", err)
		}
	case "setsid":
		if _, err := syscall.Setsid(); err != nil {
			fail("setsid", err)
		}
	case "daemon":
		// The child gets the same descriptors, the lease's among them.
		files := []uintptr{0, 1, 2}
		for _, p := range strings.Split(os.Getenv("NPURUN_LEASE"), ",") {
			if _, fdText, ok := strings.Cut(p, ":"); ok {
				if fd, err := strconv.Atoi(fdText); err == nil {
					for len(files) <= fd {
						files = append(files, ^uintptr(0)) // closed in the child
					}
					files[fd] = uintptr(fd)
				}
			}
		}
		args := []string{os.Args[0], "-escape", "setsid", "-pidfile", pidfile, "-hold", hold.String()}
		if _, err := syscall.ForkExec("/proc/self/exe", args, &syscall.ProcAttr{Env: os.Environ(), Files: files}); err != nil {
			fail("fork", err)
		}
		return
	default:
		fail("escape", fmt.Errorf("unknown mode %q", mode))
	}
	if pidfile != "" {
		f, err := os.OpenFile(pidfile, os.O_WRONLY, 0)
		if err != nil {
			fail("pidfile", err)
		}
		fmt.Fprintln(f, os.Getpid())
		f.Close()
	}
	time.Sleep(hold)
}

func fail(what string, err error) {
	fmt.Fprintf(os.Stderr, "workload: %s: %v\n", what, err)
	os.Exit(4)
}
