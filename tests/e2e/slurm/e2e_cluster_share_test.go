package slurm

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// TestLoginClusterShares: with [cluster] shares = "npurun" on the login
// node, --mem is a share of a node's own npurun devices (split mode: each
// node has one Slurm device, 0, and one of npurun's own, 1, taking shares
// of 16G). Four tasks of 6G submitted at once run at the same time, two
// per node: each sees device 1, and each waits, in the workload, until
// all four have started, which two whole devices could not give. npurun
// --mem on the login side runs its command on a share alike.
func TestLoginClusterShares(t *testing.T) {
	c := harness.StartSlurmCluster(t, harness.SlurmClusterOptions{Devices: 1, Own: 1,
		Node:  "[share]\npools = \"all\"\ncapacity = \"16G\"\nmargin = \"0\"\n",
		Login: "shares = \"npurun\"\n"})
	bins := harness.Bins(t)
	u := harness.NewUser(t)
	// The jobs' npurun: the node's, talking to its own broker (one
	// machine, two brokers: routed by the node's name, as the Prolog is).
	path := harness.SharedDir(t)
	c.WriteRoute(filepath.Join(path, "npurun"), func(n *harness.SlurmClusterNode) string { return bins.Npurun + " --socket " + n.B.Socket })
	login := func(program string, args ...string) (string, string, int) {
		cmd := c.Login(&u, program, args...)
		cmd.Env = append(cmd.Env, "PATH="+path+":"+os.Getenv("PATH"))
		return loginRun(cmd)
	}
	marks := harness.SharedDir(t)
	os.Chmod(marks, 0o1777)
	const tasks = 4
	job := fmt.Sprintf(`echo "$SLURMD_NODENAME $ASCEND_RT_VISIBLE_DEVICES" > %[1]s/ran.$SLURM_JOB_ID
i=0
while [ "$(ls %[1]s | grep -c '^ran\.')" -lt %[2]d ]; do
	i=$((i+1)); [ $i -lt 600 ] || { echo "not all %[2]d ran at once" >&2; exit 4; }
	sleep 0.1
done`, marks, tasks)
	var ids []string
	for range tasks {
		out, errs, code := login(bins.TaskSubmit, "--mem", "6G", "--run", job)
		m := submittedRE.FindStringSubmatch(out)
		if code != 0 || m == nil {
			t.Fatalf("task-submit --mem 6G: status %d, printed %q, said %q", code, out, errs)
		}
		ids = append(ids, m[1])
	}
	nodes := map[string]int{}
	for _, id := range ids {
		if _, errs, code := login(bins.TaskSubmit, "wait", id); code != 0 {
			log, _, _ := login(bins.TaskSubmit, "logs", id)
			t.Errorf("task %s: status %d, said %q; its log:\n%s\n%s", id, code, errs, log, c.NodeLogs())
			continue
		}
		data, err := os.ReadFile(filepath.Join(marks, "ran."+id))
		f := strings.Fields(string(data))
		if err != nil || len(f) != 2 || f[1] != "1" {
			t.Errorf("task %s ran with %q (%v), not on device 1, npurun's own", id, data, err)
			continue
		}
		nodes[f[0]]++
	}
	if nodes["n1"] != 2 || nodes["n2"] != 2 {
		t.Errorf("the tasks ran %v, not two on each node", nodes)
	}
	// list and show tell a share by its memory, as on a box (Slurm's job
	// has no GRES: the job's comment keeps it).
	if out, _, _ := login(bins.TaskSubmit, "show", ids[0]); !strings.Contains(out, "memory: 6G declared (a share of each device)\n") || !strings.Contains(out, "devices: 1 wanted") {
		t.Errorf("show %s:\n%s", ids[0], out)
	}
	if out, _, _ := login(bins.TaskSubmit, "list", "--ended"); strings.Count(out, " 1 wanted (6G) ") != tasks {
		t.Errorf("list --ended shows not %d shares of 6G:\n%s", tasks, out)
	}
	out, errs, code := login(bins.Npurun, "--mem", "4G", "--", "sh", "-c", "echo $ASCEND_RT_VISIBLE_DEVICES; exit 3")
	if code != 3 || out != "1\n" {
		t.Errorf("npurun --mem 4G on the login side: status %d, printed %q, said %q", code, out, errs)
	}
	if _, errs, code := login(bins.TaskSubmit, "--mem", "4G", "-n", strconv.Itoa(1), "-d", "1", "--", "true"); code != 2 {
		t.Errorf("task-submit -d through Slurm: status %d, said %q", code, errs)
	}
}
