//go:build !cgo

package broker

import (
	"bufio"
	"os"
	"strings"
	"syscall"
)

// passwdShell is name's login shell from /etc/passwd: without cgo there
// is no NSS, as for os/user (the Makefile builds npubroker with cgo).
func passwdShell(name string) (string, error) {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) == 7 && fields[0] == name {
			return fields[6], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", syscall.ENOENT
}
