package slurm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestCheckConfigSlurm: check-config compares [slurm] gres_devices with
// Slurm's gres.conf (configured, or beside $SLURM_CONF): a count or an
// order that disagrees, a File= that is no character device or none of
// the managed devices' nodes, each a warning naming gres.conf's line and
// the position; a [slurm] table in error exits 1 naming its line.
func TestCheckConfigSlurm(t *testing.T) {
	bin := harness.Bins(t)
	dir := t.TempDir()
	// Device nodes as links to real character devices, each its own
	// device number (no mknod, no root): davinci0..3.
	dev := filepath.Join(dir, "dev")
	if err := os.Mkdir(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, target := range []string{"/dev/full", "/dev/zero", "/dev/random", "/dev/urandom"} {
		if err := os.Symlink(target, filepath.Join(dev, "davinci"+string(rune('0'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/dev/null", filepath.Join(dev, "other")); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	conf := func(gres, extra string) string {
		return "[devices]\nvendor = \"ascend\"\nids = \"0-3\"\ndev_dir = \"" + dev + "\"\nnpu_smi = \"/nonexistent/npu-smi\"\n" +
			"[slurm]\ngres_devices = \"2-3\"\nnode = \"box\"\n" + gres + extra
	}
	good := write("good-gres.conf", "AutoDetect=off\nName=gpu Type=910b File="+dev+"/davinci[2-3]\n")
	swapped := write("swapped-gres.conf", "Name=gpu File="+dev+"/davinci[3,2]\n")
	three := write("three-gres.conf", "NodeName=box Name=gpu File="+dev+"/davinci[1-3]\nNodeName=elsewhere Name=gpu File=/dev/nvidia[0-7]\n")
	stranger := write("stranger-gres.conf", "Name=gpu File="+dev+"/other\nName=gpu File="+dir+"/good-gres.conf\n")
	// Beside SLURM_CONF, when [slurm] names no gres_conf.
	slurmDir := filepath.Join(dir, "slurm")
	if err := os.Mkdir(slurmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(slurmDir, "gres.conf"), []byte("Name=gpu File="+dev+"/davinci2\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		conf   string
		env    []string
		code   int
		err    []string
		errNot []string
	}{
		{name: "agrees", conf: conf("gres_conf = \""+good+"\"\n", ""), code: 0, errNot: []string{"warning"}},
		{name: "swapped", conf: conf("gres_conf = \""+swapped+"\"\n", ""), code: 0, err: []string{
			"[slurm]: warning: " + swapped + ":1: position 0, " + dev + "/davinci3: device 3's node, but [slurm] gres_devices puts device 2 at position 0",
			swapped + ":1: position 1, " + dev + "/davinci2: device 2's node, but [slurm] gres_devices puts device 3 at position 1"}},
		{name: "count", conf: conf("gres_conf = \""+three+"\"\n", ""), code: 0, err: []string{
			three + ` lists 3 device files of gres "gpu" for node "box", [slurm] gres_devices 2 ("2,3")`,
			three + ":1: position 0, " + dev + "/davinci1: device 1's node, but [slurm] gres_devices puts device 2 at position 0"}},
		{name: "strangers", conf: conf("gres_conf = \""+stranger+"\"\n", ""), code: 0, err: []string{
			stranger + ":1: position 0, " + dev + "/other: device 1:3 is the node of none of the devices npurun manages",
			stranger + ":2: position 1, " + dir + "/good-gres.conf: not a character device"}},
		{name: "other gres name", conf: conf("gres_conf = \""+good+"\"\ngres_name = \"npu\"\n", ""), code: 0, err: []string{
			good + ` names no gres "npu" for node "box"`}},
		{name: "beside SLURM_CONF", conf: conf("", ""), env: []string{"SLURM_CONF=" + filepath.Join(slurmDir, "slurm.conf")}, code: 0, err: []string{
			filepath.Join(slurmDir, "gres.conf") + ` lists 1 device files of gres "gpu" for node "box", [slurm] gres_devices 2`}},
		{name: "unreadable", conf: conf("gres_conf = \""+dir+"/none.conf\"\n", ""), code: 0, err: []string{
			"[slurm]: warning: read gres.conf: open " + dir + "/none.conf: no such file or directory: gres_devices not compared"}},
		{name: "error", conf: conf("gres_conf = \""+good+"\"\nmode = \"shared\"\n", ""), code: 1, err: []string{
			`:10: [slurm] mode: unknown mode "shared" (want "split" or "allocate")`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := write("npurun.conf", tc.conf)
			cmd := exec.Command(bin.Broker, "check-config", p)
			cmd.Env = append(os.Environ(), "SLURM_CONF=/nonexistent/slurm.conf")
			cmd.Env = append(cmd.Env, tc.env...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tc.code, stderr.String())
			}
			for _, w := range tc.err {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks\n%s\nstderr:\n%s", w, stderr.String())
				}
			}
			for _, w := range tc.errNot {
				if strings.Contains(stderr.String(), w) {
					t.Errorf("stderr has %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

// TestServeSlurmSplit (once TestServeRefusesSlurm, while the broker did
// not serve a Slurm node): a configuration with [slurm] starts the broker,
// which warns at its start what check-config warns (here: no gres.conf to
// compare gres_devices with), and in split mode leases Slurm's devices to Slurm jobs only: npurun
// naming one is refused with the reason and what to do, the pool of every
// device is the others, and Slurm's operations are root's alone.
func TestServeSlurmSplit(t *testing.T) {
	gres := filepath.Join(harness.SharedDir(t), "gres.conf") // none: serve warns as check-config does
	b := harness.NewBroker(t, harness.FakeConfig(4)+fmt.Sprintf("[slurm]\ngres_devices = \"2-3\"\ngres_conf = %q\n", gres))
	b.Start()
	b.WaitLog(0, "[slurm]: warning: read gres.conf: ")
	out, err := b.Npurun("-d", "2", "true").CombinedOutput()
	if want := `npurun: npu 2 is Slurm's ([slurm] mode "split"): ask Slurm for it (srun --gres=gpu:1)`; err == nil || !strings.Contains(string(out), want) {
		t.Errorf("npurun -d 2: %v\n%s\nwant: %s", err, out, want)
	}
	out, err = b.Npurun("-n", "2", "sh", "-c", "echo $NPURUN_DEVICES").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "0,1" {
		t.Errorf("npurun -n 2: %v, ran on %q, want 0,1", err, out)
	}
	out, err = b.Npurun("-n", "3", "true").CombinedOutput()
	if want := `3 devices asked, pool "default" has only 2`; err == nil || !strings.Contains(string(out), want) {
		t.Errorf("npurun -n 3: %v\n%s\nwant: %s", err, out, want)
	}
	if os.Geteuid() != 0 {
		return // a broker not run as root serves no Slurm operation to anyone: below, a user is refused
	}
	u := harness.NewUser(t)
	prolog := u.As(exec.Command(b.Bin.Slurm, "prolog", "--socket", b.Socket), b.Dir)
	prolog.Env = append(prolog.Env, "SLURM_JOB_ID=7", fmt.Sprintf("SLURM_JOB_UID=%d", u.UID), "SLURM_JOB_USER="+u.Name, "SLURM_JOB_GPUS=0")
	out, err = prolog.CombinedOutput()
	if want := "the broker refused: the Slurm operations are slurmd's and slurmstepd's (root only)"; err != nil || !strings.Contains(string(out), want) {
		t.Errorf("a Prolog run by %s: %v\n%s\nwant: %s", u.Name, err, out, want)
	}
	if d := harness.Device(t, b.Board(t), 2); d.State != wire.DeviceFree || d.Pool != "" {
		t.Errorf("npu 2 after a user's Prolog: %+v", d)
	}
}
