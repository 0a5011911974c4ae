package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// pamBuild is pam_npurun.so, built as the Makefile builds it (warnings are
// errors), and the PAM helper (the one cgo program of the tests).
type pamBuild struct {
	Dir, Module, Helper string
	Preload             string // NPURUN_PAM_SANITIZE: the sanitizers' runtime
}

// With NPURUN_PAM_SANITIZE=1 the module is built by clang with
// AddressSanitizer and UndefinedBehaviorSanitizer, and their runtime is
// preloaded into the module's hosts (pamhelper, sshd): a memory error or
// undefined behaviour in the module ends its host, which the tests see as
// a crash. Not for CI (it needs clang and libclang-rt); for a review run.
var pamSanitize = os.Getenv("NPURUN_PAM_SANITIZE") == "1"

// PAMHostEnv is the environment of a process that loads the module.
func PAMHostEnv(t testing.TB) []string {
	env := os.Environ()
	if p := PAMBins(t).Preload; p != "" {
		env = append(env, "LD_PRELOAD="+p, "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0", "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
	}
	return env
}

var pamOnce = sync.OnceValues(func() (*pamBuild, error) {
	dir, err := os.MkdirTemp("", "npurun-pam-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	root := Root()
	p := &pamBuild{Dir: dir, Module: filepath.Join(dir, "pam_npurun.so"), Helper: filepath.Join(dir, "pamhelper")}
	mk := exec.Command("make", "--no-print-directory", "-C", root, "BUILDDIR="+dir, p.Module)
	if pamSanitize {
		mk.Args = append(mk.Args, "CC=clang", "CFLAGS=-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all -shared-libasan")
		out, err := exec.Command("clang", "-print-file-name=libclang_rt.asan-x86_64.so").Output()
		if err != nil {
			return nil, fmt.Errorf("NPURUN_PAM_SANITIZE: find the ASan runtime: %v", err)
		}
		p.Preload = strings.TrimSpace(string(out))
	}
	if out, err := mk.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("make pam_npurun.so: %v\n%s", err, out)
	}
	gb := exec.Command("go", "build", "-tags", "pamhelper", "-o", p.Helper, "github.com/npurun/npurun/tests/pamhelper")
	gb.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := gb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build pamhelper: %v\n%s", err, out)
	}
	return p, nil
})

func PAMBins(t testing.TB) *pamBuild {
	t.Helper()
	NeedPAMHeaders(t)
	p, err := pamOnce()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// PAMService writes a PAM service file into a directory of its own: the
// module with args, then pam_permit so that a module that steps aside
// (PAM_IGNORE) leaves a working stack. It returns the directory.
func PAMService(t testing.TB, name, control, args string) string {
	t.Helper()
	dir := t.TempDir()
	var lines string
	if control != "" {
		lines = fmt.Sprintf("session %s %s %s\n", control, PAMBins(t).Module, args)
	}
	lines += "session required pam_permit.so\n"
	if err := os.WriteFile(filepath.Join(dir, name), []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// StartPAM starts the helper opening a session of user with service from
// confDir, and extra helper flags.
func StartPAM(t testing.TB, confDir, service, user string, flags ...string) *Proc {
	t.Helper()
	args := append([]string{"-confdir", confDir, "-service", service, "-user", user}, flags...)
	cmd := exec.Command(PAMBins(t).Helper, args...)
	cmd.Env = PAMHostEnv(t)
	return StartProc(t, "pamhelper "+user, cmd)
}

// RunPAM runs the helper to its end and returns its output and how long it
// ran.
func RunPAM(t testing.TB, confDir, service, user string, flags ...string) (string, time.Duration) {
	t.Helper()
	start := time.Now()
	p := StartPAM(t, confDir, service, user, flags...)
	code, sig := p.Wait()
	took := time.Since(start)
	<-p.OutDone
	if code != 0 || sig != 0 {
		t.Fatalf("pamhelper: exit %d signal %v (a crash of the module's host?); output:\n%s", code, sig, p.Output())
	}
	return p.Output(), took
}
