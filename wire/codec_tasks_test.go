package wire

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func intp(n int) *int { return &n }

var taskSamples = []TaskInfo{
	{ID: 1, User: "root", UID: 0, State: StatePending, Command: "true", Cwd: "/work", Log: "/tmp/x/task.log", Position: 1, Submitted: 1795703034449},
	{ID: 18446744073709551615, User: "al\"ice<&>", UID: 4294967295, Name: "sweep \u2028 é \xff", State: StateFailed, Command: "sh -c 'a\tb\n'",
		Cwd: "/", Env: []string{"A=1", "B=<x>"}, Log: "\x01\x7f", N: 2, Pool: "queue", Mem: 20480, OOMRetries: 1, RetryOf: 7, NoDevice: true,
		Devices: []int{0, 3}, After: []uint64{5, 18446744073709551615}, TimeSec: 3600, Position: 3, Start: 1795703034000, Submitted: -1,
		Started: 2, Ended: 3, Exit: intp(-3), Signal: "SIGKILL", Reason: "time limit", CPUMs: 5, MemPeak: 6, DevPeak: 7, Token: "tok",
		Held: true, From: 9, Source: SourceAccounting},
	{ID: 2, State: StateDone, Exit: intp(0), Devices: []int{}, After: []uint64{}, Env: []string{}},
	{ID: 3, State: StateRunning, Submitted: 1, Backfill: &Backfill{EndsBy: 1795703034000, Before: "task <118>", BeforeStart: 1795703035000, Beside: true}},
	{},
}

// TestAppendTaskInfoAgreesWithJSON: the hand encoding of a task is
// encoding/json's, byte for byte, for the samples and for each field set
// alone.
func TestAppendTaskInfoAgreesWithJSON(t *testing.T) {
	check := func(ti *TaskInfo) {
		t.Helper()
		want, err := json.Marshal(ti)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendTaskInfo(nil, ti); string(got) != string(want) {
			t.Errorf("task %+v\nhand: %s\njson: %s", *ti, got, want)
		}
		if got, want := AppendTaskInfoNoHTML(nil, ti), noHTML(t, ti); string(got) != want {
			t.Errorf("task %+v without HTML escapes\nhand: %s\njson: %s", *ti, got, want)
		}
	}
	for i := range taskSamples {
		check(&taskSamples[i])
	}
	tt := reflect.TypeFor[TaskInfo]()
	for i := range tt.NumField() {
		var ti TaskInfo
		if !sampleValue(reflect.ValueOf(&ti).Elem().Field(i)) {
			t.Fatalf("no sample value of %s", tt.Field(i).Type)
		}
		check(&ti)
	}
}

// tasksReply is a page of a listing with ts, as the broker writes it.
func tasksReply(ts []TaskInfo, more bool, next uint64) []byte {
	b := []byte(`{"v":1,"type":"tasks","tasks":[`)
	for i := range ts {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendTaskInfo(b, &ts[i])
	}
	b = append(b, ']')
	if more {
		b = append(b, `,"more":true,"next":`...)
		b = strconv.AppendUint(b, next, 10)
	}
	return append(b, '}')
}

// TestDecodeTasksAgreesWithJSON: the hand decoder reads a page of a
// listing as encoding/json does, and leaves to it what it might read
// otherwise (a null, a key in another case).
func TestDecodeTasksAgreesWithJSON(t *testing.T) {
	ins := []string{
		string(tasksReply(taskSamples, true, 42)),
		string(tasksReply(taskSamples[:1], false, 0)),
		string(tasksReply(nil, false, 0)),
		`{"v":1,"type":"tasks","tasks":null}`,
		`{"v":1,"type":"tasks","tasks":[{"id":3,"exit":7,"exit":8,"devices":[1],"devices":[2,3],"unknown":{"a":[null]}}]}`,
	}
	// Each field set alone, as encoding/json writes it: a field added to
	// TaskInfo without its place in the hand decoder fails here.
	tt := reflect.TypeFor[TaskInfo]()
	for i := range tt.NumField() {
		var ti TaskInfo
		sampleValue(reflect.ValueOf(&ti).Elem().Field(i))
		b, err := json.Marshal(&Reply{V: 1, Type: TypeTasks, Tasks: []TaskInfo{ti}})
		if err != nil {
			t.Fatal(err)
		}
		ins = append(ins, string(b))
	}
	for _, in := range ins {
		var want Reply
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatalf("sample %s: encoding/json: %v", in, err)
		}
		got, ok, err := decodeReply([]byte(in))
		if err != nil || !ok {
			t.Errorf("decodeReply(%s): ok %v, %v", in, ok, err)
			continue
		}
		if !reflect.DeepEqual(*got, want) {
			t.Errorf("decodeReply(%s)\n got %+v\nwant %+v", in, *got, want)
		}
	}
	for _, in := range []string{
		`{"type":"tasks","tasks":[null]}`,
		`{"type":"tasks","tasks":[{"id":1,"name":null}]}`,
		`{"type":"tasks","tasks":[{"id":1,"exit":null}]}`,
		`{"type":"tasks","tasks":[{"ID":1}]}`,
		`{"type":"tasks","tasks":[{"Id":1}]}`,
		`{"type":"tasks","tasks":[{"uid":4294967296}]}`,
	} {
		if _, ok, err := decodeReply([]byte(in)); ok || err != nil {
			t.Errorf("decodeReply(%s): ok %v, err %v; want it left to encoding/json", in, ok, err)
		}
	}
}

// FuzzDecodeTasks: whatever task the hand decoder accepts, encoding/json
// reads the same.
func FuzzDecodeTasks(f *testing.F) {
	f.Add(tasksReply(taskSamples, true, 42))
	f.Add([]byte(`{"type":"tasks","tasks":[{"id":3,"exit":7,"after":[1]}]}`))
	f.Fuzz(decodeAgreesWithJSON)
}

// FuzzAppendTaskInfo: the hand encoding of any task is encoding/json's,
// byte for byte.
func FuzzAppendTaskInfo(f *testing.F) {
	f.Add("alice", "python train.py <in >out & wait", "/home/alice", "sweep \u2028 é \xff \x01", int64(3), uint64(7))
	f.Fuzz(func(t *testing.T, user, command, cwd, name string, n int64, id uint64) {
		ti := TaskInfo{ID: id, User: user, Name: name, State: StatePending, Command: command, Cwd: cwd, Log: cwd + name,
			N: int(n), Mem: n, Devices: []int{int(n)}, After: []uint64{id}, Submitted: n, Exit: intp(int(n)), Reason: command, Token: user}
		want, err := json.Marshal(&ti)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendTaskInfo(nil, &ti); string(got) != string(want) {
			t.Fatalf("hand: %s\njson: %s", got, want)
		}
		if got, want := AppendTaskInfoNoHTML(nil, &ti), noHTML(t, &ti); string(got) != want {
			t.Fatalf("without HTML escapes\nhand: %s\njson: %s", got, want)
		}
	})
}

// noHTML is ti as an encoding/json Encoder without HTML escapes writes
// it, less the newline.
func noHTML(t *testing.T, ti *TaskInfo) string {
	var b strings.Builder
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(ti); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}
