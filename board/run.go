package board

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"os/user"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// Usage is npuboard's usage line.
const Usage = "npuboard [--config FILE] [--socket PATH] [--listen ADDR] [--host NAME] [--user NAME]"

const help = `Usage:
  ` + Usage + `

npuboard serves a read-only web page of this box's devices (who holds
which, the line, utilization, the last day as a timeline) and of the
boxes named in [board] peers, with the same data as JSON. It asks the
broker as any user does, and never runs as root: as root it needs --user.

Options:
`

// memoryLimit is npuboard's soft heap limit.
const memoryLimit = 20 << 20

// DefaultConfig is the configuration file npuboard reads [board] from.
const DefaultConfig = "/etc/npurun/npurun.conf"

// Run runs npuboard with args and returns its exit status.
func Run(args []string, stderr io.Writer) int {
	fs := pflag.NewFlagSet("npuboard", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(stderr)
	conf := fs.String("config", "", "the configuration file, for its [board] table (default "+DefaultConfig+")")
	socket := fs.String("socket", "", "the broker's socket (default $NPURUN_SOCKET, else "+wire.DefaultSocket+")")
	listen := fs.String("listen", "", "host:port to serve on (default [board] listen, else "+policy.DefaultBoardListen+")")
	host := fs.String("host", "", "this box's name on the page (default the host name)")
	runAs := fs.String("user", "", "as root: the user to serve as (npuboard refuses to serve as root)")
	fs.Usage = func() {
		fmt.Fprint(stderr, help)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitcode.OK
		}
		fmt.Fprintf(stderr, "npuboard: %v\n", err)
		return exitcode.Usage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "npuboard: takes no arguments, got %q\n", fs.Arg(0))
		return exitcode.Usage
	}
	cfg, err := loadConfig(*conf)
	if err != nil {
		fmt.Fprintf(stderr, "npuboard: %v\n", err)
		return exitcode.Failure
	}
	if *listen == "" {
		*listen = cfg.Board.Listen
	}
	if *socket == "" {
		*socket = os.Getenv("NPURUN_SOCKET")
	}
	if *socket == "" {
		*socket = wire.DefaultSocket
	}
	if err := dropRoot(*runAs); err != nil {
		fmt.Fprintf(stderr, "npuboard: %v\n", err)
		if os.Geteuid() == 0 {
			fmt.Fprintln(stderr, "npuboard: hint: run it as a user of its own (the package's unit runs it as npuboard), or as root with --user npuboard")
		}
		return exitcode.Failure
	}
	// A soft limit on the heap (GOMEMLIMIT overrides it): npuboard's
	// garbage is the pages it draws, and a small daemon beside the
	// users' jobs should give it back rather than grow to twice its heap.
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(memoryLimit)
	}
	lg := log.New(stderr, "npuboard: ", 0)
	s := New(Config{Socket: *socket, Host: *host, Refresh: cfg.Board.Refresh, Peers: cfg.Board.Peers, Log: lg})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "npuboard: listen on %s: %v\n", *listen, err)
		return exitcode.Failure
	}
	lg.Printf("serving http://%s/ for the broker at %s", ln.Addr(), *socket)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go s.Run(ctx)
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 60 * time.Second, MaxHeaderBytes: 16 << 10}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "npuboard: %v\n", err)
		return exitcode.Failure
	}
	return exitcode.OK
}

// loadConfig reads the configuration: the file named, or the default one
// where there is one (defaults where there is none).
func loadConfig(path string) (*policy.Config, error) {
	if path == "" {
		if _, err := os.Stat(DefaultConfig); errors.Is(err, fs.ErrNotExist) {
			return policy.Parse(DefaultConfig, nil)
		}
		path = DefaultConfig
	}
	return policy.Load(path)
}

// dropRoot refuses root, or, as root with name, becomes that user (its
// group, no supplementary groups) for good. Without root, name must be
// the user npuboard runs as, or empty.
func dropRoot(name string) error {
	if os.Geteuid() != 0 {
		if name != "" {
			if u, err := user.Lookup(name); err != nil || u.Uid != strconv.Itoa(os.Geteuid()) {
				return fmt.Errorf("--user %s: only root can become another user", name)
			}
		}
		return nil
	}
	if name == "" {
		return errors.New("refusing to serve as root")
	}
	u, err := user.Lookup(name)
	if err != nil {
		return fmt.Errorf("--user: %v", err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("--user %s: uid %q, gid %q", name, u.Uid, u.Gid)
	}
	if uid == 0 {
		return fmt.Errorf("--user %s: that is root", name)
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("drop supplementary groups: %w", err)
	}
	if err := syscall.Setgid(gid); err != nil {
		return fmt.Errorf("setgid %d: %w", gid, err)
	}
	if err := syscall.Setuid(uid); err != nil {
		return fmt.Errorf("setuid %d: %w", uid, err)
	}
	if os.Geteuid() == 0 || os.Getuid() == 0 || syscall.Setuid(0) == nil {
		return errors.New("still root after setuid")
	}
	return nil
}
