package broker

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/claim"
	"github.com/npurun/npurun/internal/owndir"
	"github.com/npurun/npurun/npu"
)

// claimName is the file in the run and state directories whose flock a
// broker holds for its life, and which holds its pid.
const claimName = "broker.pid"

// ErrClaimed means another broker uses the directory.
var ErrClaimed = errors.New("another broker uses it")

// Claim takes dir for this broker for as long as the returned file stays
// open: an exclusive flock on dir/broker.pid, which then holds this
// process's pid. Two brokers on one run directory would fight over its
// socket and lock files; on one state directory, both would run the same
// queued task. If another broker holds the claim, the error names its pid
// and wraps ErrClaimed.
func Claim(dir string) (*os.File, error) {
	path := filepath.Join(dir, claimName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("claim %s: %w", dir, err)
	}
	err = claim.Lock(int(f.Fd()))
	switch {
	case errors.Is(err, unix.EWOULDBLOCK):
		defer f.Close()
		if pid := readPID(f); pid > 0 {
			return nil, fmt.Errorf("%s: %w (pid %d); stop it first, or give this one other directories", dir, ErrClaimed, pid)
		}
		return nil, fmt.Errorf("%s: %w; stop it first, or give this one other directories", dir, ErrClaimed)
	case err != nil:
		f.Close()
		return nil, fmt.Errorf("claim %s: %w", dir, err)
	}
	// The pid is for people and for the message above; the flock is the
	// claim, so a full disk that keeps the pid out does not stop the broker.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

func readPID(f *os.File) int {
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	pid, err := strconv.Atoi(string(bytes.TrimSpace(buf[:n])))
	if err != nil {
		return 0
	}
	return pid
}

// claimState takes the state directory for this broker's life, once: two
// brokers replaying one journal would run the same task twice.
func (s *Server) claimState(dir string) error {
	if s.stateClaim != nil {
		return nil
	}
	if err := owndir.Make(dir, 0o700); err != nil {
		return err
	}
	f, err := Claim(dir)
	if err != nil {
		return err
	}
	s.stateClaim = f
	return nil
}

// One broker per device, whatever its directories. A broker claims each
// device it manages that has a device node by the node's device number
// (the kernel's name for the device: two nodes of one number are one
// device, wherever they are and whatever configuration names them), with
// an flock on a file named by that number in one directory that every
// broker of the machine uses, not one of its own run or state directory.
// The claims are taken before the broker makes a lock file or changes an
// ACL, and held for its life: a broker killed with SIGKILL lets them go
// with its descriptors.
//
// The directory is root's, mode 0700, in /run (which only root may write),
// so that no other user can make, take or replace a claim. An unprivileged
// broker (tests, make demo) claims in a directory of its user's. Fake
// devices have no node: their lock files are all there is of them, and
// the run directory's claim covers those.

// DeviceClaimDir is where a broker running as root claims its devices.
const DeviceClaimDir = "/run/npurun-devices"

// ClaimDirEnv names a variable that puts the device claims elsewhere: for
// tests, whose brokers run side by side on trees of nodes made with mknod
// that share device numbers. Brokers see each other only where they claim
// in the same directory, so it has no place in a production setup.
const ClaimDirEnv = "NPUBROKER_CLAIM_DIR"

// ClaimDir is the directory of the device claims: $NPUBROKER_CLAIM_DIR if
// set, DeviceClaimDir for root, else $XDG_RUNTIME_DIR/npurun-devices or,
// without it, a directory of the user's in the temporary directory.
func ClaimDir() string {
	if d := os.Getenv(ClaimDirEnv); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return DeviceClaimDir
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "npurun-devices")
	}
	return filepath.Join(os.TempDir(), "npurun-devices-"+strconv.Itoa(os.Geteuid()))
}

// DeviceClaims are the claims a broker holds on its devices.
type DeviceClaims struct{ files []*os.File }

// Close lets the claims go.
func (c *DeviceClaims) Close() {
	for _, f := range c.files {
		f.Close()
	}
}

// ClaimDevices claims, in dir, every device of inv that has a device node,
// for as long as the returned claims stay open. If another broker holds the
// claim of one, the error names the device, its node and the other
// broker's pid, and wraps ErrClaimed; nothing is claimed then.
func ClaimDevices(inv *npu.Inventory, dir string) (*DeviceClaims, error) {
	type node struct {
		id   int
		path string
		name string // the claim's file name, from the device number
		rdev uint64
	}
	var nodes []node
	seen := map[uint64]bool{}
	for _, id := range inv.IDs {
		for _, p := range inv.Nodes(id) {
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil {
				return nil, fmt.Errorf("claim npu %d: %w", id, err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFCHR {
				return nil, fmt.Errorf("claim npu %d: %s is not a character device", id, p)
			}
			// Nodes of one number are one device (a test's tree makes
			// every node a /dev/null): claimed once.
			if !seen[st.Rdev] {
				seen[st.Rdev] = true
				nodes = append(nodes, node{id: id, path: p, rdev: st.Rdev,
					name: fmt.Sprintf("c%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))})
			}
		}
	}
	claims := &DeviceClaims{}
	if len(nodes) == 0 {
		return claims, nil
	}
	dfd, err := openClaimDir(dir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	for _, n := range nodes {
		f, err := claimAt(dfd, dir, n.name)
		if err != nil {
			claims.Close()
			what := fmt.Sprintf("npu %d (%s, device %d:%d)", n.id, n.path, unix.Major(n.rdev), unix.Minor(n.rdev))
			if errors.Is(err, ErrClaimed) {
				return nil, fmt.Errorf("%s: %w; stop it first: one broker per device, whatever its run and state directories", what, err)
			}
			return nil, fmt.Errorf("claim %s: %w", what, err)
		}
		claims.files = append(claims.files, f)
	}
	return claims, nil
}

// openClaimDir makes dir if need be and opens it, refusing a symbolic link
// and a directory that is not the broker's user's alone.
func openClaimDir(dir string) (int, error) {
	if err := owndir.Make(dir, 0o700); err != nil {
		return -1, fmt.Errorf("device claims: %w", err)
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("device claims: open %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil || st.Uid != uint32(os.Geteuid()) || st.Mode&0o077 != 0 {
		unix.Close(dfd)
		return -1, fmt.Errorf("device claims: %s is not the broker's user's alone (mode 0700)", dir)
	}
	return dfd, nil
}

// claimAt takes the claim file name in the directory open at dfd (path,
// for messages): an exclusive flock, then this process's pid in it. If
// another holds it, the error names its pid and wraps ErrClaimed.
func claimAt(dfd int, dir, name string) (*os.File, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Openat(dfd, name, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", filepath.Join(dir, name), err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, name))
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file", f.Name())
	}
	switch err := claim.Lock(fd); {
	case errors.Is(err, unix.EWOULDBLOCK):
		defer f.Close()
		if pid := readPID(f); pid > 0 {
			return nil, fmt.Errorf("%w (pid %d)", ErrClaimed, pid)
		}
		return nil, ErrClaimed
	case err != nil:
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
