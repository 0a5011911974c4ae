package client

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// SessionPolicyFile is the file, beside the broker's socket, that tells
// pam_npurun.so and npurun --login what to do while no broker answers:
// the broker writes it at start from [restrict]. One item a line:
//
//	on_broker_down deny
//	user guest 1005
//	group students 1001
//
// ids are as resolved at the broker's start, "-" where the account was
// unknown then. Lines starting with # are comments.
const SessionPolicyFile = "session-policy"

// maxSessionPolicy caps the file's size for its readers.
const maxSessionPolicy = 64 << 10

// SessionPolicy is the session-policy file.
type SessionPolicy struct {
	OnBrokerDown string // "hide" or "deny"
	Users        []Account
	Groups       []Account
}

// Account is a user or group named in the session-policy file; ID is -1
// where it was unknown.
type Account struct {
	Name string
	ID   int64
}

// Marshal writes the file's contents.
func (p *SessionPolicy) Marshal() []byte {
	var b bytes.Buffer
	b.WriteString("# Written by npubroker at start, from [restrict]: what pam_npurun.so and\n# npurun --login do while no broker answers. See pam_npurun(8).\n")
	fmt.Fprintf(&b, "on_broker_down %s\n", p.OnBrokerDown)
	for _, kind := range []string{"user", "group"} {
		list := p.Users
		if kind == "group" {
			list = p.Groups
		}
		for _, a := range list {
			id := "-"
			if a.ID >= 0 {
				id = strconv.FormatInt(a.ID, 10)
			}
			fmt.Fprintf(&b, "%s %s %s\n", kind, a.Name, id)
		}
	}
	return b.Bytes()
}

// ParseSessionPolicy reads the file's contents.
func ParseSessionPolicy(data []byte) (*SessionPolicy, error) {
	p := &SessionPolicy{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "on_broker_down" && (f[1] == "hide" || f[1] == "deny"):
			p.OnBrokerDown = f[1]
		case len(f) == 3 && (f[0] == "user" || f[0] == "group"):
			a := Account{Name: f[1], ID: -1}
			if f[2] != "-" {
				id, err := strconv.ParseUint(f[2], 10, 32)
				if err != nil {
					return nil, fmt.Errorf("line %d: bad id %q", n, f[2])
				}
				a.ID = int64(id)
			}
			if f[0] == "user" {
				p.Users = append(p.Users, a)
			} else {
				p.Groups = append(p.Groups, a)
			}
		default:
			return nil, fmt.Errorf("line %d: not understood: %q", n, line)
		}
	}
	if p.OnBrokerDown == "" {
		return nil, errors.New("no on_broker_down line")
	}
	return p, nil
}

// ReadSessionPolicy reads the session-policy file beside socket. It trusts
// only a regular file owned by root and writable by nobody else.
func ReadSessionPolicy(socket string) (*SessionPolicy, error) {
	path := filepath.Join(filepath.Dir(socket), SessionPolicyFile)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("%s: not a regular file", path)
	case st.Uid != 0 || st.Mode&0o022 != 0:
		return nil, fmt.Errorf("%s: not root's alone (owner uid %d, mode %o)", path, st.Uid, st.Mode&0o777)
	case st.Size > maxSessionPolicy:
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxSessionPolicy)
	}
	data := make([]byte, st.Size)
	n, err := f.Read(data)
	if err != nil && st.Size > 0 {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	p, err := ParseSessionPolicy(data[:n])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// Restricts tells whether the file restricts the account of uid, name and
// groups (primary and supplementary gids). Root never is restricted.
func (p *SessionPolicy) Restricts(uid uint32, name string, gids []uint32) bool {
	if uid == 0 {
		return false
	}
	for _, u := range p.Users {
		if u.ID == int64(uid) || (u.ID < 0 && u.Name == name && name != "") {
			return true
		}
	}
	for _, g := range p.Groups {
		for _, gid := range gids {
			if g.ID == int64(gid) {
				return true
			}
		}
	}
	return false
}
