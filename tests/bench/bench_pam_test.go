package bench

import (
	"fmt"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
)

// benchPAMSessions is how many sessions each case of BenchmarkPAMOpenSession
// opens and closes.
const benchPAMSessions = 300

// BenchmarkPAMOpenSession: time spent in pam_open_session on the real PAM
// stack (the helper times each call), p50 and p90, for a stack without
// pam_npurun.so, for an unrestricted user with it, and for a restricted
// user granted a login lease of a free device (ACL entries written, lock
// descriptors passed). Targets: ≤ 1 ms added unrestricted, ≤ 5 ms added
// restricted.
func BenchmarkPAMOpenSession(b *testing.B) {
	harness.NeedRoot(b)
	dev := harness.NewDevTree(b, 8)
	var users []harness.TestUser
	for range 2 {
		name := fmt.Sprintf("npurun-tb%d%d", time.Now().UnixNano()%100000, len(users))
		if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
			b.Fatalf("useradd: %v: %s", err, out)
		}
		b.Cleanup(func() { exec.Command("userdel", name).Run() })
		u, err := user.Lookup(name)
		if err != nil {
			b.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		users = append(users, harness.TestUser{Name: name, UID: uint32(uid), GID: uint32(gid)})
	}
	student, staff := users[0], users[1]
	// Eight devices in the login pool: each session finds one free while
	// the previous one's release completes; a busy pool would hide, and
	// the count of leases says so.
	br := harness.StartBroker(b, dev.Config("0-7", fmt.Sprintf("[restrict]\nusers = [%q]\non_busy = \"hide\"\n", student.Name)))
	without := harness.PAMService(b, "npurun-bench", "", "")
	with := harness.PAMService(b, "npurun-bench", "required", "socket="+br.Socket+" lease")

	sample := func(conf, who string) ([]time.Duration, int) {
		out, _ := harness.RunPAM(b, conf, "npurun-bench", who, "-repeat", strconv.Itoa(benchPAMSessions), "-quiet")
		var ds []time.Duration
		leases := -1
		for _, line := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(line, "time "); ok {
				ns, _ := strconv.ParseInt(v, 10, 64)
				ds = append(ds, time.Duration(ns))
			} else if v, ok := strings.CutPrefix(line, "leases "); ok {
				leases, _ = strconv.Atoi(v)
			} else if line != "" {
				b.Fatalf("pamhelper: %s", line)
			}
		}
		return ds[10:], leases // the first few warm caches up
	}
	b.ResetTimer()
	for range b.N {
		base, _ := sample(without, staff.Name)
		plain, _ := sample(with, staff.Name)
		restricted, leases := sample(with, student.Name)
		if leases != benchPAMSessions {
			b.Errorf("%d of %d restricted sessions got a lease", leases, benchPAMSessions)
		}
		us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
		for _, c := range []struct {
			name string
			ds   []time.Duration
		}{{"without module", base}, {"unrestricted", plain}, {"restricted, lease", restricted}} {
			p50, p90 := benchQuantile(c.ds, 0.5), benchQuantile(c.ds, 0.9)
			b.Logf("%-18s p50 %7.0f µs  p90 %7.0f µs  (added p50 %+.0f µs, p90 %+.0f µs)", c.name, us(p50), us(p90),
				us(p50-benchQuantile(base, 0.5)), us(p90-benchQuantile(base, 0.9)))
		}
		b.ReportMetric(us(benchQuantile(plain, 0.5)-benchQuantile(base, 0.5)), "unrestricted-added-p50-µs")
		b.ReportMetric(us(benchQuantile(restricted, 0.5)-benchQuantile(base, 0.5)), "restricted-added-p50-µs")
		b.ReportMetric(us(benchQuantile(restricted, 0.9)-benchQuantile(base, 0.9)), "restricted-added-p90-µs")
	}
}
