package client

import (
	"encoding/json"
	"reflect"
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
			case TypeGrant, TypeQueued, TypeError, TypePong, TypeOK, TypeIgnore, TypeHide:
				t.Errorf("decodeReply(%s) declined a lease reply", in)
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
	if _, ok := appendRequest(nil, &Request{V: 1, Op: OpList}); ok {
		t.Error("appendRequest took a list request; only lease requests are hand-encoded")
	}
}

// FuzzDecodeReply: whatever the hand codec accepts, encoding/json accepts
// too, with the same result.
func FuzzDecodeReply(f *testing.F) {
	for _, s := range replySamples {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
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
	})
}
