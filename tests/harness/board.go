package harness

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// npuboardOnce builds npuboard beside the other programs, once.
var npuboardOnce = sync.OnceValues(func() (string, error) {
	b, err := BuildOnce()
	if err != nil {
		return "", err
	}
	path := filepath.Join(b.Dir, "npuboard")
	cmd := exec.Command("go", "build", "-trimpath", "-o", path, "github.com/npurun/npurun/cmd/npuboard")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // as the Makefile builds it
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build npuboard: %v\n%s", err, out)
	}
	return path, nil
})

// Npuboard is the built npuboard.
func Npuboard(t testing.TB) string {
	t.Helper()
	path, err := npuboardOnce()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// FreePort is a loopback address whose port nothing listens on now.
func FreePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// StartBoard starts npuboard for broker b on listen, as root dropping to
// user (its --user), with the configuration file conf (its [board]) and
// this box's name host; it returns once npuboard serves.
func StartBoard(t testing.TB, b *Broker, conf, listen, host, user string) *Proc {
	t.Helper()
	cmd := exec.Command(Npuboard(t), "--config", conf, "--socket", b.Socket, "--listen", listen, "--host", host, "--user", user)
	p := StartProc(t, "npuboard "+host, cmd)
	p.WaitLine("npuboard: serving http://" + listen)
	return p
}

// Chromium is the path of Debian's chromium: the test skips without it,
// except in CI (CI=true), where .ci/run installs it.
func Chromium(t testing.TB) string {
	t.Helper()
	NeedTool(t, "chromium", "/usr/bin/chromium")
	return "/usr/bin/chromium"
}

// Browse runs headless Chromium on url with args (--dump-dom prints the
// DOM after the page's scripts ran; --screenshot=PATH), in a profile of
// its own, and returns what it printed on standard output.
func Browse(t testing.TB, url string, args ...string) string {
	t.Helper()
	bin := Chromium(t)
	profile := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--disable-extensions", "--disable-background-networking", "--user-data-dir=" + profile}, args...)
	cmd := exec.CommandContext(ctx, bin, append(all, url)...)
	cmd.Env = append(os.Environ(), "HOME="+profile)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}
