package wire

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
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

// ParseSessionPolicy reads the file's contents. pam_npurun.c's
// restricted_down reads it the same way, and the same files are run through
// both (tests/e2e/access/e2e_pam_rule_test.go): lines split at '\n', fields at ASCII
// blanks (space, \t, \r, \v, \f); a line blank or starting with '#' (after
// blanks) is skipped; "on_broker_down hide|deny" (the last one counts), "user
// NAME ID" and "group NAME ID" with ID decimal digits within 32 bits or "-",
// each with exactly these fields. Anything else, a NUL byte or no
// on_broker_down line, and the file is not read at all.
func ParseSessionPolicy(data []byte) (*SessionPolicy, error) {
	p := &SessionPolicy{}
	if bytes.IndexByte(data, 0) >= 0 {
		return nil, errors.New("a NUL byte")
	}
	for n, line := range strings.Split(string(data), "\n") {
		f := strings.FieldsFunc(line, isBlank)
		if len(f) == 0 || f[0][0] == '#' {
			continue
		}
		switch {
		case len(f) == 2 && f[0] == "on_broker_down" && (f[1] == "hide" || f[1] == "deny"):
			p.OnBrokerDown = f[1]
		case len(f) == 3 && (f[0] == "user" || f[0] == "group"):
			a := Account{Name: f[1], ID: -1}
			if f[2] != "-" {
				id, err := parseID(f[2])
				if err != nil {
					return nil, fmt.Errorf("line %d: bad id %q", n+1, f[2])
				}
				a.ID = id
			}
			if f[0] == "user" {
				p.Users = append(p.Users, a)
			} else {
				p.Groups = append(p.Groups, a)
			}
		default:
			return nil, fmt.Errorf("line %d: not understood: %q", n+1, strings.TrimFunc(line, isBlank))
		}
	}
	if p.OnBrokerDown == "" {
		return nil, errors.New("no on_broker_down line")
	}
	return p, nil
}

// isBlank is a field separator of the session-policy file: the ASCII
// blanks C's reader splits at too.
func isBlank(r rune) bool {
	return r == ' ' || r == '\t' || r == '\r' || r == '\v' || r == '\f'
}

// parseID reads an id of the session-policy file: decimal digits only (no
// sign), within 32 bits.
func parseID(s string) (int64, error) {
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, errors.New("not digits")
		}
	}
	id, err := strconv.ParseUint(s, 10, 32)
	return int64(id), err
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

// Identity is an account as the session-policy file's rule sees it.
type Identity struct {
	UID uint32
	// Name is the user database's name for UID, "" where it has none.
	Name string
	// GIDs are the account's groups, primary and supplementary.
	GIDs []uint32
}

// Self is the identity of this process's real user: the real uid, its
// name and groups from the user database (never $USER, which the user
// sets), and the process's own groups besides (a login's, as initgroups
// set them: the same ones).
func Self() Identity {
	id := Identity{UID: uint32(os.Getuid())}
	add := func(g uint32) {
		if !slices.Contains(id.GIDs, g) {
			id.GIDs = append(id.GIDs, g)
		}
	}
	add(uint32(os.Getgid()))
	if gids, err := unix.Getgroups(); err == nil {
		for _, g := range gids {
			add(uint32(g))
		}
	}
	u, err := user.LookupId(strconv.FormatUint(uint64(id.UID), 10))
	if err != nil {
		return id
	}
	id.Name = u.Username
	gids, _ := u.GroupIds() // includes the primary group
	for _, s := range append(gids, u.Gid) {
		if g, err := strconv.ParseUint(s, 10, 32); err == nil {
			add(uint32(g))
		}
	}
	return id
}

// Restricts tells whether the file restricts account a while no broker
// answers. The rule, pam_npurun.c's restricted_down's too (the same table
// runs through both: tests/e2e/access/e2e_pam_rule_test.go):
//
//   - root (uid 0) never is restricted;
//   - a "user NAME ID" line restricts the account whose uid is ID, and the
//     account named NAME (the file's ids are those of the broker's start,
//     the names the configuration's: either matches);
//   - a "group NAME ID" line restricts a member of group ID, or, with ID
//     "-" (unknown at the broker's start), of the group named NAME now.
func (p *SessionPolicy) Restricts(a Identity) bool {
	if a.UID == 0 {
		return false
	}
	for _, u := range p.Users {
		if u.ID == int64(a.UID) || (a.Name != "" && u.Name == a.Name) {
			return true
		}
	}
	for _, g := range p.Groups {
		gid := g.ID
		if gid < 0 {
			gr, err := user.LookupGroup(g.Name)
			if err != nil {
				continue
			}
			n, err := strconv.ParseUint(gr.Gid, 10, 32)
			if err != nil {
				continue
			}
			gid = int64(n)
		}
		if slices.Contains(a.GIDs, uint32(gid)) {
			return true
		}
	}
	return false
}
