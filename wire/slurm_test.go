package wire

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestAppendSlurmAgreesWithJSON: the Slurm operations the hand codec
// writes (npurun-slurm links no encoding/json) decode, with
// encoding/json, to the request encoded, and are what encoding/json
// itself writes where no string needs escaping.
func TestAppendSlurmAgreesWithJSON(t *testing.T) {
	for _, req := range []Request{
		{V: 1, Op: OpSlurmProlog, Job: &SlurmJob{ID: 42, UID: 1001, User: "alice", GRES: "0,1"}},
		{V: 1, Op: OpSlurmProlog, Job: &SlurmJob{ID: 4294967295, UID: 0, User: "root"}},
		{V: 1, Op: OpSlurmEpilog, Job: &SlurmJob{ID: 7, UID: 5, GRES: "3"}},
		{V: 1, Op: OpSlurmHold, Job: &SlurmJob{ID: 7, UID: 5}},
		{V: 1, Op: OpSlurmTask, Job: &SlurmJob{ID: 7, UID: 5, Step: SlurmBatchStep}},
		{V: 1, Op: OpSlurmProlog, Job: &SlurmJob{ID: 1, User: "we\"ird\\ \n\x01 <é>"}},
	} {
		b, ok := appendRequest(nil, &req)
		if !ok {
			t.Fatalf("appendRequest(%+v) declined", req)
		}
		var got Request
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("appendRequest(%+v) wrote %s: %v", req, b, err)
		}
		if !reflect.DeepEqual(got, req) {
			t.Errorf("round trip of %+v (%+v) gave %+v (%+v); wrote %s", req, *req.Job, got, got.Job, b)
		}
		if req.Job.User == "alice" || req.Job.User == "" {
			j, _ := json.Marshal(&req)
			if string(j) != string(b) {
				t.Errorf("hand codec wrote %s, encoding/json %s", b, j)
			}
		}
	}
	for _, req := range []Request{
		{V: 1, Op: OpSlurmProlog},                                   // no job
		{V: 1, Op: OpAcquire, Job: &SlurmJob{ID: 1}},                // a job on another op
		{V: 1, Op: OpSlurmHold, Job: &SlurmJob{ID: 1}, N: 2},        // a field the op has not
		{V: 1, Op: OpSlurmTask, Job: &SlurmJob{ID: 1}, User: "bob"}, // likewise
	} {
		if b, ok := appendRequest(nil, &req); ok {
			t.Errorf("appendRequest took %+v, writing %s", req, b)
		}
	}
}

// TestSlurmRepliesDecode: the replies npurun-slurm reads come through the
// hand codec as encoding/json reads them.
func TestSlurmRepliesDecode(t *testing.T) {
	for _, in := range []string{
		`{"v":1,"type":"ok","devices":[4,5],"message":"job 42 of alice holds npu 4-5"}`,
		`{"v":1,"type":"ok","message":"no lease of job 42 to end"}`,
		`{"v":1,"type":"error","code":"no-slurm","message":"no [slurm] table in /etc/npurun/npurun.conf"}`,
		`{"v":1,"type":"ignore"}`,
	} {
		got, ok, err := decodeReply([]byte(in))
		if err != nil || !ok {
			t.Fatalf("decodeReply(%s) = %v, %v", in, ok, err)
		}
		var want Reply
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(*got, want) {
			t.Errorf("decodeReply(%s) = %+v, want %+v", in, *got, want)
		}
	}
}
