package journal

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/npurun/npurun/wire"
)

// diskSample is a task with every field of its record set, and an end
// record with a status.
func diskSample() []*Record {
	exit, umask := 3, uint32(0o22)
	st := &wire.Status{Exit: &exit, Signal: "SIGKILL", Reason: "r", CPUMs: 1, MemPeak: 2, DevicePeak: 3, OOM: true}
	t := &Task{ID: 7, UID: 1000, User: "u",
		Sub: wire.Submission{Argv: []string{"a"}, Shell: "s", Cwd: "/c", Env: []string{"E=1"}, N: 2, Devices: []int{0, 1},
			Pool: "p", Mem: 512, OOMRetries: 1, RetryOf: 6, NoDevice: true, TimeSec: 60, Name: "n", After: []uint64{5},
			Log: "/l", Umask: &umask, Token: "tok", Notify: "echo", NoNotify: true},
		Argv: []string{"a"}, Log: "/l", TimeSec: 60, State: Done, Submitted: 1, Started: 2, Ended: 3,
		Devices: []int{0}, Slot: -1, PID: 9, PIDStart: 10, Boot: "b", ArmBoot: "ab", StartMono: 11,
		Status: st, Reason: "why", Held: true, From: 4, Notify: "echo"}
	return []*Record{{Op: opTask, Task: t}, {Op: opEnd, ID: 7, Time: 3, State: Done, Status: statusOnDisk(st), Reason: "why"}}
}

// diskGolden is the journal's format, written down: the lines diskSample
// makes. A change to the wire's types (a field renamed, a tag changed)
// must not change it; a change to it is a change of the format on disk,
// to be made here, on purpose, with the journal able to read the old one.
const diskGolden = `{"op":"task","task":{"id":7,"uid":1000,"user":"u","sub":{"argv":["a"],"shell":"s","cwd":"/c","env":["E=1"],"n":2,"devices":[0,1],"pool":"p","mem":512,"oom_retries":1,"retry_of":6,"no_device":true,"time_sec":60,"name":"n","after":[5],"log":"/l","umask":18,"token":"tok","notify":"echo","no_notify":true},"argv":["a"],"log":"/l","time_sec":60,"state":"done","submitted":1,"started":2,"ended":3,"devices":[0],"slot":-1,"pid":9,"pid_start":10,"boot":"b","arm_boot":"ab","start_mono":11,"status":{"exit":3,"signal":"SIGKILL","reason":"r","cpu_ms":1,"mem_peak":2,"device_peak":3,"oom":true},"reason":"why","held":true,"from":4,"notify":"echo"}}
{"op":"end","id":7,"time":3,"state":"done","status":{"exit":3,"signal":"SIGKILL","reason":"r","cpu_ms":1,"mem_peak":2,"device_peak":3,"oom":true},"reason":"why"}
`

// TestRecordFormat: the journal writes its records in its own format
// (diskGolden), and reads back what it wrote.
func TestRecordFormat(t *testing.T) {
	recs := diskSample()
	b, err := encode(recs...)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != diskGolden {
		t.Errorf("journal records:\n%s\nwant (the format on disk):\n%s", b, diskGolden)
	}
	// Read back, each line encodes to itself.
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var back Record
		if err := json.Unmarshal(line, &back); err != nil {
			t.Fatal(err)
		}
		again, err := encode(&back)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, line) {
			t.Errorf("read back and written again:\n%s\nwant:\n%s", again, line)
		}
	}
}
