package broker

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/broker/tasklife"
	"github.com/npurun/npurun/policy"
)

// TestEncodedSizeBounds: the sizes a submission is checked by are never
// below what the show reply and the supervisor's Spec encode to, and not
// far above, whatever the strings hold.
func TestEncodedSizeBounds(t *testing.T) {
	s := &Server{socket: "/run/npurun/broker.sock", cfg: &policy.Config{Tasks: policy.Tasks{CPUThreads: 4, IdlePriority: true}}}
	pieces := []string{"a", "<", ">", "&", "\"", "\\", "\n", "\t", "\x01", "\x7f", "é", "\u2028", "\xff", "'", " ", "𝄞"}
	rnd := rand.New(rand.NewPCG(1, 2))
	text := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteString(pieces[rnd.IntN(len(pieces))])
		}
		return b.String()
	}
	for i := range 200 {
		sub := client.Submission{Cwd: "/" + text(20), Name: text(10), NoDevice: i%2 == 0}
		if i%5 == 0 {
			sub.After = []uint64{1 << 63, 12, 99999999}
			sub.Devices = []int{0, 100, 1 << 20}
		}
		for range rnd.IntN(20) {
			sub.Env = append(sub.Env, "V"+text(3)+"="+text(rnd.IntN(300)))
		}
		if i%3 == 0 {
			sub.Shell = text(rnd.IntN(2000))
		} else {
			for range 1 + rnd.IntN(10) {
				sub.Argv = append(sub.Argv, text(rnd.IntN(200)))
			}
		}
		tk := &tasklife.Task{ID: 1 << 40, UID: 1000, User: "u" + text(5), Sub: sub, Log: "/" + text(50), Slot: -1,
			Argv: sub.Argv}
		if sub.Shell != "" {
			tk.Argv = []string{"/bin/sh", "-c", sub.Shell}
		}
		reply, err := json.Marshal(&client.Reply{V: client.Version, Type: client.TypeTasks, Tasks: []client.TaskInfo{info(tk, true, 1<<20)}})
		if err != nil {
			t.Fatal(err)
		}
		spec, err := json.Marshal(s.specLocked(tk))
		if err != nil {
			t.Fatal(err)
		}
		if got := replyLen(tk); got < len(reply) || got > len(reply)+replyFrame {
			t.Errorf("case %d: replyLen %d for a reply of %d bytes", i, got, len(reply))
		}
		if got := s.specLen(tk); got < len(spec) || got > len(spec)+specFrame+1024 {
			t.Errorf("case %d: specLen %d for a Spec of %d bytes", i, got, len(spec))
		}
	}
}
