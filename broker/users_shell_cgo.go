//go:build cgo

package broker

/*
#include <errno.h>
#include <pwd.h>
#include <stdlib.h>

static int npurun_shell(const char *name, char *buf, size_t len, char **shell) {
	struct passwd pw, *found = NULL;
	int err = getpwnam_r(name, &pw, buf, len, &found);
	if (err != 0)
		return err;
	if (found == NULL)
		return ENOENT;
	*shell = pw.pw_shell;
	return 0;
}
*/
import "C"

import (
	"syscall"
	"unsafe"
)

// passwdShell is name's login shell in the user database, asked through
// NSS in this process (getpwnam_r), as os/user asks the rest.
func passwdShell(name string) (string, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	for size := 1 << 10; size <= 1<<20; size *= 4 {
		buf := C.malloc(C.size_t(size))
		var shell *C.char
		rc := C.npurun_shell(cname, (*C.char)(buf), C.size_t(size), &shell)
		if rc == C.ERANGE {
			C.free(buf)
			continue
		}
		var s string
		if rc == 0 {
			s = C.GoString(shell)
		}
		C.free(buf)
		if rc != 0 {
			return "", syscall.Errno(rc)
		}
		return s, nil
	}
	return "", syscall.ERANGE
}
