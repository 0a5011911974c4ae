package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// requestSamples are requests encoding/json reads; hand: the hand decoder
// takes them too (else it leaves them to encoding/json).
var requestSamples = []struct {
	in   string
	hand bool
}{
	{`{"v":1,"op":"acquire"}`, true},
	{`{"v":1,"op":"acquire","n":2,"pool":"queue","no_wait":true}`, true},
	{`{"v":1,"op":"acquire","n":2,"pool":"share","mem":12288}`, true},
	{`{"v":1,"op":"acquire","devices":[9,3],"pool":"we\"ird\\ \n\u0001 é \ud83d\ude00 bad ` + "\xff" + `"}`, true},
	{` { "v" : 1 , "op" : "ping" } `, true},
	{`{"v":1,"op":"session","login":true}`, true},
	{`{"v":1,"op":"session","user":"alice","service":"sshd","tty":"pts/3","rhost":"10.0.0.5","login":false}`, true},
	{`{"v":1,"op":"acquire","n":1,"user":"bob","service":"login","tty":"tty1\u001b[2J"}`, true},
	{`{"v":1,"op":"acquire","devices":[]}`, true},
	{`{"v":1,"op":"acquire","n":1,"n":3,"devices":[1],"devices":[2,4]}`, true},
	{`{"v":2,"op":"acquire"}`, true},
	{`{"v":-0,"op":"acquire","n":-1}`, true},
	{`{"op":"acquire"}`, true},
	{`{"v":1,"op":"list"}`, false},
	{`{"v":1,"op":"submit","task":{"argv":["x"],"cwd":"/"}}`, false},
	{`{"v":1,"op":"acquire","OP":"ping"}`, false},
	{`{"v":1,"op":"acquire","Pool":"x"}`, false},
	{`{"v":1,"op":"acquire","pool":null}`, false},
	{`{"v":1,"op":"acquire","devices":null}`, false},
	{`{"v":1,"op":"acquire","extra":{"a":[1,2]}}`, false},
}

var malformedRequests = []string{
	``, `{`, `[]`, `null`, `{"v":1,"op":"acquire"`, `{"v":1,"op":"acquire",}`, `{"v":1,"op":acquire}`,
	`{"v":1.0,"op":"acquire"}`, `{"v":1e0,"op":"acquire"}`, `{"v":"1","op":"acquire"}`, `{"v":99999999999999999999,"op":"acquire"}`,
	`{"v":1,"op":"acquire","devices":[1,]}`, `{"v":1,"op":"acquire","devices":["1"]}`, `{"v":1,"op":"acquire","n":1.5}`,
	`{"v":1,"op":"acquire","pool":"a` + "\x01" + `"}`, `{"v":1,"op":"acquire","pool":"\q"}`, `{"v":1,"op":"acquire"} x`,
	`{"v":1,"op":"acquire"}` + "\x00", `{"v":1,"op":"acquire","no_wait":tru}`, `{"v":1,"op":"acquire","no_wait":1}`,
}

// TestDecodeRequestAgreesWithJSON: what the broker's hand decoder takes,
// it decodes as encoding/json does; what it declines or cannot read,
// encoding/json decides (and malformed input it never takes).
func TestDecodeRequestAgreesWithJSON(t *testing.T) {
	for _, tc := range requestSamples {
		var want Request
		if err := json.Unmarshal([]byte(tc.in), &want); err != nil {
			t.Fatalf("sample %s: encoding/json: %v", tc.in, err)
		}
		got, ok := DecodeRequest([]byte(tc.in))
		if ok != tc.hand {
			t.Errorf("DecodeRequest(%s) took it: %v, want %v", tc.in, ok, tc.hand)
		}
		if ok && !reflect.DeepEqual(*got, want) {
			t.Errorf("DecodeRequest(%s)\n got %+v\nwant %+v", tc.in, *got, want)
		}
	}
	for _, in := range malformedRequests {
		if r, ok := DecodeRequest([]byte(in)); ok {
			t.Errorf("DecodeRequest(%q) = %+v, want declined", in, *r)
		}
	}
}

// FuzzDecodeRequest: whatever the hand decoder takes, encoding/json takes
// too, to the same request.
func FuzzDecodeRequest(f *testing.F) {
	for _, tc := range requestSamples {
		f.Add([]byte(tc.in))
	}
	for _, s := range malformedRequests {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		got, ok := DecodeRequest(in)
		if !ok {
			return
		}
		var want Request
		if err := json.Unmarshal(in, &want); err != nil {
			t.Fatalf("DecodeRequest took %q, encoding/json says %v", in, err)
		}
		if !reflect.DeepEqual(*got, want) {
			t.Fatalf("DecodeRequest(%q)\n got %+v\nwant %+v", in, *got, want)
		}
	})
}

var leaseReplies = []Reply{
	{V: 1, Type: TypeGrant, Devices: []int{0, 3}, Vendor: "fake", Env: []string{"NPURUN_DEVICES=0,3", "ASCEND_RT_VISIBLE_DEVICES=0,3"}, WaitedMS: 41000},
	{V: 1, Type: TypeGrant, Devices: []int{1}, Vendor: "fake", EndsBy: 1795703034000, Before: "task 118", Beside: true},
	{V: 1, Type: TypeQueued, Pool: "default", Position: 3, Ahead: []string{"alice", "bob"}, Reason: "alice holds 4 of 4 devices allowed (user alice)"},
	{V: 1, Type: TypeError, Code: CodeDenied, Message: "pool \"q<u>e&ue\" is not open to bob\n\ttab \\ \b\f\r\x01\x1f\x7f é \xff \u2028\u2029 😀", Hint: "pools: a, b"},
	{V: 1, Type: TypePong},
	{V: 1, Type: TypeIgnore},
	{V: 1, Type: TypeHide, Env: []string{"NPURUN_DEVICES=", "ASCEND_RT_VISIBLE_DEVICES="}, Message: "no device free"},
	{V: 1, Type: TypeQueued, Pool: "interactive", WaitMS: 30000},
	{V: 1, Type: TypeGrant, Devices: []int{4}, Env: []string{"NPURUN_DEVICES=4"}, Message: "npu 4 is yours until you log out"},
	{V: 1, Type: TypeGrant, Devices: []int{}, Ahead: []string{}, Env: []string{}, Position: -2, WaitedMS: -1},
	{},
}

// TestAppendReplyAgreesWithJSON: the broker writes the lease exchange's
// replies byte for byte as encoding/json does, and declines the others.
func TestAppendReplyAgreesWithJSON(t *testing.T) {
	for _, r := range leaseReplies {
		want, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := AppendReply(nil, &r)
		if !ok {
			t.Errorf("AppendReply declined %+v", r)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("AppendReply(%+v)\n got %s\nwant %s", r, got, want)
		}
	}
	for _, r := range []Reply{
		{V: 1, Type: TypeSubmitted, ID: 3},
		{V: 1, Type: TypeSubmitted, State: "pending"},
		{V: 1, Type: TypeTasks, Tasks: []TaskInfo{{}}},
		{V: 1, Type: TypeTasks, More: true},
		{V: 1, Type: TypeTasks, Next: 9},
		{V: 1, Type: TypeStatus, Board: &Board{}},
		{V: 1, Type: TypeUsage, Usage: &UsageReport{}},
	} {
		if b, ok := AppendReply(nil, &r); ok {
			t.Errorf("AppendReply took %+v, writing %s", r, b)
		}
	}
	// Every field of Reply, set alone, is written as encoding/json writes
	// it or declined: a field added to Reply without its place here fails.
	rt := reflect.TypeFor[Reply]()
	for i := range rt.NumField() {
		var r Reply
		if !sampleValue(reflect.ValueOf(&r).Elem().Field(i)) {
			continue // a struct: declined above
		}
		got, ok := AppendReply(nil, &r)
		if !ok {
			continue
		}
		want, _ := json.Marshal(&r)
		if !bytes.Equal(got, want) {
			t.Errorf("Reply.%s: got %s, want %s", rt.Field(i).Name, got, want)
		}
	}
}

// FuzzAppendReply: the hand encoder writes what encoding/json writes.
func FuzzAppendReply(f *testing.F) {
	f.Add("grant", "default", "alice", "x<y>&z", "NPURUN_DEVICES=1", 3, int64(7), 2)
	f.Fuzz(func(t *testing.T, typ, pool, ahead, msg, env string, pos int, ms int64, dev int) {
		r := Reply{V: Version, Type: typ, Pool: pool, Position: pos, Ahead: []string{ahead}, Reason: msg, WaitMS: ms,
			Devices: []int{dev}, Vendor: pool, Env: []string{env, msg}, WaitedMS: -ms, Code: typ, Message: msg, Hint: ahead}
		got, ok := AppendReply(nil, &r)
		if !ok {
			t.Fatal("declined")
		}
		want, _ := json.Marshal(&r)
		if !bytes.Equal(got, want) {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
	})
}

func BenchmarkDecodeRequest(b *testing.B) {
	in := []byte(`{"v":1,"op":"acquire","n":2,"pool":"queue"}`)
	b.Run("hand", func(b *testing.B) {
		for b.Loop() {
			if _, ok := DecodeRequest(in); !ok {
				b.Fatal("declined")
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			var r Request
			if err := json.Unmarshal(in, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkAppendReply(b *testing.B) {
	r := &Reply{V: 1, Type: TypeGrant, Devices: []int{0, 3}, Vendor: "fake", Env: []string{"NPURUN_DEVICES=0,3", "ASCEND_RT_VISIBLE_DEVICES=0,3"}, WaitedMS: 1}
	b.Run("hand", func(b *testing.B) {
		for b.Loop() {
			AppendReply(make([]byte, 0, 256), r)
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			json.Marshal(r)
		}
	})
}
