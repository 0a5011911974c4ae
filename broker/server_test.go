package broker

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// startServer serves a broker of configuration confText on a real socket
// in a temporary directory, its executable as if in bin (where a task's
// supervisor is looked for), until the test ends: the server, its
// socket and its configuration file.
func startServer(t *testing.T, confText, bin string) (*Server, string, string) {
	t.Helper()
	confFile := filepath.Join(t.TempDir(), "npurun.conf")
	if err := os.WriteFile(confFile, []byte(confText), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := policy.Load(confFile)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := npu.Discover(npu.Vendor(cfg.Vendor), cfg.IDs, cfg.DevDir, cfg.NPUSmi)
	if err != nil {
		t.Fatal(err)
	}
	run := t.TempDir()
	sock := filepath.Join(run, "broker.sock")
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Config: cfg, ConfigPath: confFile, Inventory: inv, RunDir: run, StateDir: filepath.Join(run, "spool"),
		Socket: sock, Cgroup: "off", Self: filepath.Join(bin, "npubroker"), Log: failLog(t)})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		stop()
		<-served
	})
	return s, sock, confFile
}
