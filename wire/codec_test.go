package wire

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
)

var replySamples = []string{
	`{"v":1,"type":"grant","devices":[0,3],"vendor":"fake","env":["NPURUN_DEVICES=0,3","ASCEND_RT_VISIBLE_DEVICES=0,3"],"waited_ms":41000}`,
	`{"v":1,"type":"queued","pool":"default","position":3,"ahead":["alice","bob"],"reason":"alice holds 4 of 4 devices allowed (user alice)"}`,
	`{"v":1,"type":"error","code":"denied","message":"pool \"queue\" is not open to bob\n\ttab \\ slash \/ \u00e9 \ud83d\ude00","hint":"pools: a, b"}`,
	` { "v" : 1 , "type" : "pong" } `,
	`{"v":1,"type":"ok","unknown":{"nested":[1,2.5e3,-4,true,false,null,"x",{"y":[]}]},"other":null}`,
	`{"type":"grant","devices":null,"env":null}`,
	`{"type":"error","message":"lone \ud800 surrogate, pair \ud83d\ude00, broken \ud83d\u0041, raw é, bad ` + "\xff" + ` byte"}`,
	`{"type":"queued","position":1,"type":"grant"}`,
	`{}`,
	`{"v":1,"type":"ignore"}`,
	`{"v":1,"type":"hide","env":["NPURUN_DEVICES=","ASCEND_RT_VISIBLE_DEVICES="],"message":"no device free in pool \"interactive\""}`,
	`{"v":1,"type":"queued","wait_ms":30000}`,
	`{"v":1,"type":"grant","devices":[4],"env":["NPURUN_DEVICES=4"],"message":"npu 4 is yours until you log out"}`,
	`{"v":1,"type":"submitted","id":118,"state":"pending","pool":"queue","position":3}`,
	`{"v":1,"type":"submitted","id":18446744073709551615,"state":"running","reason":"starting on npu 0,3"}`,
	`{"v":1,"type":"submitted","id":7,"state":"failed","reason":"failed: dependency 6 failed"}`,
}

// TestDecodeReplyAgreesWithJSON: the hand codec decodes what
// encoding/json decodes, to the same value.
func TestDecodeReplyAgreesWithJSON(t *testing.T) {
	for _, in := range replySamples {
		var want Reply
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatalf("sample %s: encoding/json: %v", in, err)
		}
		got, ok, err := decodeReply([]byte(in))
		if err != nil {
			t.Errorf("decodeReply(%s): %v", in, err)
			continue
		}
		if !ok {
			switch want.Type {
			case TypeGrant, TypeQueued, TypeError, TypePong, TypeOK, TypeIgnore, TypeHide, TypeSubmitted:
				t.Errorf("decodeReply(%s) declined a lease or submitted reply", in)
			}
			continue
		}
		if !reflect.DeepEqual(*got, want) {
			t.Errorf("decodeReply(%s)\n got %+v\nwant %+v", in, *got, want)
		}
	}
}

func TestDecodeReplyRejectsMalformed(t *testing.T) {
	for _, in := range []string{
		``, `{`, `{"type":"grant"`, `{"type":"grant",}`, `{"type":grant}`, `{"devices":[1,]}`,
		`{"position":1.5}`, `{"position":"1"}`, `{"type":"a\x01"}`, `{"type":"\q"}`, `{"type":"ok"} x`,
		`{"env":[1]}`, `{"v":99999999999999999999}`, `[]`, `{"type":"\ud83d\u12"}`,
		`{"id":-1}`, `{"id":1.5}`, `{"id":1e3}`, `{"id":18446744073709551616}`, `{"id":"7"}`, `{"state":7}`,
	} {
		if _, _, err := decodeReply([]byte(in)); err == nil {
			t.Errorf("decodeReply(%q) = nil error, want malformed", in)
		}
	}
}

// TestAppendRequestAgreesWithJSON: what the hand codec writes decodes, with
// encoding/json, to the request it encoded.
func TestAppendRequestAgreesWithJSON(t *testing.T) {
	for _, req := range []Request{
		{V: 1, Op: OpAcquire},
		{V: 1, Op: OpAcquire, N: 2, Pool: "queue", NoWait: true},
		{V: 1, Op: OpAcquire, N: 2, Pool: "share", Mem: 12288},
		{V: 1, Op: OpAcquire, N: 1, TimeSec: 600},
		{V: 1, Op: OpAcquire, Devices: []int{9, 3}, Pool: "we\"ird\\ \n\x01 é \xff"},
		{V: 1, Op: OpPing},
		{V: 1, Op: OpSession, Login: true},
		{V: 1, Op: OpSession, User: "alice", Service: "sshd", TTY: "pts/3", RHost: "10.0.0.5"},
		{V: 1, Op: OpAcquire, N: 1, User: "bob", Service: "login", TTY: "tty1\x1b[2J"},
	} {
		b, ok := appendRequest(nil, &req)
		if !ok {
			t.Fatalf("appendRequest(%+v) declined", req)
		}
		var got Request
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("appendRequest(%+v) wrote %s: %v", req, b, err)
		}
		want := req
		if want.Pool == "we\"ird\\ \n\x01 é \xff" {
			want.Pool = "we\"ird\\ \n\x01 é \uFFFD"
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("round trip of %+v gave %+v (%s)", want, got, b)
		}
	}
	for _, req := range []Request{
		{V: 1, Op: OpList},
		{V: 1, Op: OpSubmit}, // no task
		{V: 1, Op: OpSubmit, Task: &Submission{}, ID: 3},         // a field submit has not
		{V: 1, Op: OpSubmit, Task: &Submission{}, Pool: "queue"}, // the pool goes in the task
		{V: 1, Op: OpAcquire, Task: &Submission{}},
		{V: 1, Op: OpTaskDone, ID: 3, Status: &Status{}},
	} {
		if b, ok := appendRequest(nil, &req); ok {
			t.Errorf("appendRequest took %+v, writing %s; only lease requests and plain submissions are hand-encoded", req, b)
		}
	}
}

var submitSamples = []Submission{
	{Argv: []string{"python", "train.py", "--lr", "0.1"}, Cwd: "/home/alice/x", Env: []string{"PATH=/usr/bin", "HOME=/home/alice"}},
	{Shell: "cd /tmp && ./run <in >out 2>&1 & wait", Cwd: "/", Env: []string{}, N: 2, Pool: "queue", Mem: 20480, OOMRetries: 2, RetryOf: 17, TimeSec: 3600, Name: "sweep 1", After: []uint64{5, 18446744073709551615}, Log: "/tmp/l og"},
	{Argv: []string{"x"}, Cwd: "/", Devices: []int{0, 7}, Log: "/tmp/\"quoted\"\n\x01\x7f é \xff \u2028"},
	{Argv: []string{""}, Cwd: "", NoDevice: true, Env: []string{"A=<&>"}, Notify: "notify-send \"$NPURUN_TASK_ID\" <&>"},
	{Argv: []string{"x"}, Cwd: "/", NoNotify: true},
	{Argv: []string{}, Cwd: "/", Devices: []int{}, After: []uint64{}},
}

// TestAppendSubmitAgreesWithJSON: a submission the hand codec writes
// decodes, with encoding/json, to what encoding/json's own encoding
// decodes to.
func TestAppendSubmitAgreesWithJSON(t *testing.T) {
	for _, sub := range submitSamples {
		req := Request{V: Version, Op: OpSubmit, Task: &sub}
		b, ok := appendRequest(nil, &req)
		if !ok {
			t.Fatalf("appendRequest declined the submission %+v", sub)
		}
		var got, want Request
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("appendRequest(%+v) wrote %s: %v", sub, b, err)
		}
		j, err := json.Marshal(&req)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(j, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("submission %+v\nhand: %s\n gives %+v\njson: %s\n gives %+v", sub, b, *got.Task, j, *want.Task)
		}
	}
}

// FuzzAppendSubmit: any submission the hand codec writes, encoding/json
// reads back as it reads its own encoding.
func FuzzAppendSubmit(f *testing.F) {
	for _, s := range submitSamples {
		f.Add(s.Shell, s.Cwd, s.Pool, s.Name, s.Log, s.N, s.TimeSec, s.NoDevice, uint64(len(s.Env)))
	}
	f.Fuzz(func(t *testing.T, shell, cwd, pool, name, log string, n int, timeSec int64, noDevice bool, after uint64) {
		sub := Submission{Argv: []string{shell, name}, Shell: shell, Cwd: cwd, Env: []string{pool, log}, N: n, Pool: pool,
			NoDevice: noDevice, TimeSec: timeSec, Name: name, After: []uint64{after}, Log: log, Devices: []int{n}}
		req := Request{V: Version, Op: OpSubmit, Task: &sub}
		b, ok := appendRequest(nil, &req)
		if !ok {
			t.Fatal("declined")
		}
		var got, want Request
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("hand encoding %q: %v", b, err)
		}
		j, _ := json.Marshal(&req)
		if err := json.Unmarshal(j, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("hand %s\njson %s", b, j)
		}
	})
}

// FuzzDecodeReply: whatever the hand codec accepts, encoding/json accepts
// too, with the same result.
func FuzzDecodeReply(f *testing.F) {
	for _, s := range replySamples {
		f.Add([]byte(s))
	}
	f.Fuzz(decodeAgreesWithJSON)
}

// decodeAgreesWithJSON fails t where decodeReply accepts in and
// encoding/json reads it otherwise, or not at all.
func decodeAgreesWithJSON(t *testing.T, in []byte) {
	got, ok, err := decodeReply(in)
	if err != nil || !ok {
		return
	}
	var want Reply
	if err := json.Unmarshal(in, &want); err != nil {
		t.Fatalf("decodeReply accepted %q, encoding/json says %v", in, err)
	}
	if !reflect.DeepEqual(*got, want) {
		t.Fatalf("decodeReply(%q)\n got %+v\nwant %+v", in, *got, want)
	}
}

// sampleValue is a value that is not zero of v's type, for a test that
// sets each field in turn; ok is false for a type it has none for.
func sampleValue(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.String:
		v.SetString("x\n\"é")
	case reflect.Int, reflect.Int64:
		v.SetInt(3)
	case reflect.Uint32, reflect.Uint64:
		v.SetUint(4)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		if !sampleValue(s.Index(0)) {
			return false
		}
		v.Set(s)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
	default:
		return false
	}
	return true
}

// TestHandCodecKnowsEveryField: each field of a submission, set alone,
// comes through the hand codec as through encoding/json; each field of a
// request, set on a submission or a lease request, is either encoded as
// encoding/json would or makes the hand codec decline; and every key of a
// reply is one the hand decoder decodes or leaves to encoding/json. A field
// added to these types without its place in codec.go fails here.
func TestHandCodecKnowsEveryField(t *testing.T) {
	agree := func(t *testing.T, req *Request) {
		t.Helper()
		b, ok := appendRequest(nil, req)
		if !ok {
			return
		}
		j, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		var got, want Request
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("hand encoding %s: %v", b, err)
		}
		if err := json.Unmarshal(j, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("hand: %s\njson: %s", b, j)
		}
	}
	st := reflect.TypeFor[Submission]()
	for i := range st.NumField() {
		t.Run("Submission."+st.Field(i).Name, func(t *testing.T) {
			var sub Submission
			if !sampleValue(reflect.ValueOf(&sub).Elem().Field(i)) {
				t.Fatalf("no sample value of %s", st.Field(i).Type)
			}
			req := &Request{V: Version, Op: OpSubmit, Task: &sub}
			if _, ok := appendRequest(nil, req); !ok {
				t.Fatalf("the hand codec declined a submission with %s set", st.Field(i).Name)
			}
			agree(t, req)
		})
	}
	rt := reflect.TypeFor[Request]()
	for i := range rt.NumField() {
		for _, op := range []string{OpSubmit, OpAcquire, OpSession, OpPing} {
			t.Run("Request."+rt.Field(i).Name+"/"+op, func(t *testing.T) {
				req := &Request{V: Version, Op: op}
				if op == OpSubmit {
					req.Task = &Submission{Cwd: "/"}
				}
				if !sampleValue(reflect.ValueOf(req).Elem().Field(i)) {
					t.Fatalf("no sample value of %s", rt.Field(i).Type)
				}
				agree(t, req)
			})
		}
	}
	for f := range reflect.TypeFor[Reply]().Fields() {
		key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !slices.Contains(replyKeys, key) {
			t.Errorf("reply key %q (Reply.%s) is not in replyKeys: the hand decoder would drop it", key, f.Name)
		}
	}
}
