package cli

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/npurun/npurun/board/fetch"
	"github.com/npurun/npurun/cluster"
	"github.com/npurun/npurun/internal/clusterconf"
	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/wire"
)

// status --cluster is the cluster's view from a login node ([cluster] in
// npurun.conf): every node of Slurm's node list with its state (a node
// down shown so), each device with the job that holds it (its GRES index
// on the node, from squeue), the line of waiting jobs per partition in
// Slurm's order, and the devices and jobs per user. It is npubroker's
// status (npurun status --cluster runs it), for a login node has no
// broker of its own to ask, and the table's code stays out of npurun.
// A node whose npuboard the configuration names ([cluster.boards]) is
// shown as its own broker sees it: its board's /api/status (npubroker
// status --json of that node: holders with their pids and commands as
// that node's privacy settings let any user see them, shares,
// utilization, unleased use), asked of every board at once while Slurm is
// asked, each within fetch.DefaultTimeout and fetch.DefaultMax. A node
// whose board does not answer, or that has none, is shown from Slurm's
// view, and one whose board does not answer says so ("board down, from
// Slurm"). The fetch is package board/fetch, npuboard's own for its
// peers: net/http it brings is in npubroker already (the broker's
// metrics), and npurun status --cluster runs npubroker, so npurun's own
// start links none of it.

// ClusterBoard is status --cluster's answer (--json).
type ClusterBoard struct {
	Time  int64                `json:"time"` // Unix ms
	Nodes []ClusterNode        `json:"nodes"`
	Line  []ClusterWaiting     `json:"line"`
	Users []ClusterUserSummary `json:"users"`
}

// ClusterNode is one node and its devices.
type ClusterNode struct {
	Name      string          `json:"name"`
	State     string          `json:"state"` // Slurm's: idle, mixed, allocated, down, drained …
	Down      bool            `json:"down,omitempty"`
	Reason    string          `json:"reason,omitempty"`
	Partition string          `json:"partition,omitempty"`
	Devices   []ClusterDevice `json:"devices"` // Slurm's view
	// From is where the node's devices are shown from: "board" (Status,
	// its broker's board through its npuboard) or "slurm" (Devices).
	From      string      `json:"from"`
	Board     string      `json:"board,omitempty"`      // its npuboard's URL, where [cluster.boards] names one
	BoardDown string      `json:"board_down,omitempty"` // why its npuboard did not answer
	Status    *wire.Board `json:"status,omitempty"`
}

// ClusterDevice is one GRES device of a node: free, or a job's.
type ClusterDevice struct {
	Index   int    `json:"index"` // its position in the node's gres.conf
	Job     uint64 `json:"job,omitempty"`
	User    string `json:"user,omitempty"`
	Since   int64  `json:"since,omitempty"` // the job's start, Unix ms
	Command string `json:"command,omitempty"`
}

// ClusterWaiting is a job in the line.
type ClusterWaiting struct {
	Job       uint64 `json:"job"`
	User      string `json:"user"`
	Partition string `json:"partition"`
	Place     int    `json:"place"`
	Devices   string `json:"devices,omitempty"` // what it asks for: "gpu:2"
	Reason    string `json:"reason,omitempty"`
	Held      bool   `json:"held,omitempty"`
	Start     int64  `json:"start,omitempty"` // estimated, Unix ms
	Submitted int64  `json:"submitted"`
	Command   string `json:"command,omitempty"`
}

// ClusterUserSummary is one user's use of the cluster.
type ClusterUserSummary struct {
	User    string `json:"user"`
	Devices int    `json:"devices"`
	Running int    `json:"running"`
	Waiting int    `json:"waiting"`
}

// clusterStatus is status --cluster.
func clusterStatus(env Env, asJSON bool) int {
	s, err := cluster.Load(clusterconf.Path())
	switch {
	case err != nil:
		fmt.Fprintf(env.Stderr, "npubroker: %v\n", err)
		return exitcode.Failure
	case s == nil:
		fmt.Fprintf(env.Stderr, "npubroker: status --cluster: no [cluster] in %s\n", clusterconf.Path())
		fmt.Fprintf(env.Stderr, "npubroker: hint: a login node's npurun.conf names its scheduler: [cluster] scheduler = \"slurm\"\n")
		return exitcode.Usage
	}
	b, err := ReadClusterBoard(s, time.Now(), fetch.DefaultTimeout)
	if err != nil {
		fmt.Fprintf(env.Stderr, "npubroker: %v\n", err)
		var ce *cluster.Error
		if errors.As(err, &ce) && ce.Down {
			fmt.Fprintf(env.Stderr, "npubroker: hint: Slurm's controller does not answer; try again later (scontrol ping)\n")
		}
		return exitcode.TempFail
	}
	if asJSON {
		return writeJSON(env, b, true)
	}
	if err := writeClusterBoard(env, b); err != nil {
		fmt.Fprintf(env.Stderr, "npubroker: %v\n", err)
		return exitcode.Failure
	}
	return exitcode.OK
}

// ReadClusterBoard asks Slurm for its nodes, jobs and estimated starts,
// and the nodes' npuboards ([cluster.boards]) for their brokers' boards,
// each within timeout.
func ReadClusterBoard(s *cluster.Slurm, now time.Time, timeout time.Duration) (*ClusterBoard, error) {
	boards := askBoards(s.Conf.Boards, timeout)
	nodes, err := s.Nodes()
	if err != nil {
		return nil, err
	}
	jobs, err := s.Jobs()
	if err != nil {
		return nil, err
	}
	starts, _ := s.Starts() // estimates only: the board stands without them
	b := &ClusterBoard{Time: now.UnixMilli(), Nodes: []ClusterNode{}, Line: []ClusterWaiting{}, Users: []ClusterUserSummary{}}
	users := map[string]*ClusterUserSummary{}
	user := func(name string) *ClusterUserSummary {
		u := users[name]
		if u == nil {
			u = &ClusterUserSummary{User: name}
			users[name] = u
		}
		return u
	}
	for _, n := range nodes {
		cn := ClusterNode{Name: n.Name, State: n.State, Down: n.Down(), Reason: n.Reason, Partition: n.Partition, Devices: []ClusterDevice{}, From: "slurm"}
		if ask, ok := boards[n.Name]; ok {
			a := <-ask
			cn.Board = s.Conf.Boards[n.Name]
			if a.err != nil {
				cn.BoardDown = a.err.Error()
			} else {
				cn.Status, cn.From = a.b, "board"
			}
		}
		for i := range gresCount(n.GRES, s.Conf.GRES) {
			cn.Devices = append(cn.Devices, ClusterDevice{Index: i})
		}
		for i := range jobs {
			j := &jobs[i]
			if j.State != cluster.StateRunning && j.State != "COMPLETING" || j.Node != n.Name {
				continue // a job of several nodes is shown by squeue, not here
			}
			for _, d := range j.Devices {
				if d >= 0 && d < len(cn.Devices) {
					cn.Devices[d] = ClusterDevice{Index: d, Job: j.ID, User: j.User, Since: j.Started.UnixMilli(), Command: j.Command}
				}
			}
		}
		b.Nodes = append(b.Nodes, cn)
	}
	places := cluster.Places(jobs)
	for i := range jobs {
		j := &jobs[i]
		switch {
		case j.State == cluster.StatePending:
			w := ClusterWaiting{Job: j.ID, User: j.User, Partition: j.Partition, Place: places[j.ID], Devices: j.GRES,
				Reason: j.Reason, Held: j.Held, Submitted: j.Submitted.UnixMilli(), Command: j.Command}
			if st, ok := starts[j.ID]; ok && !st.At.IsZero() {
				w.Start = st.At.UnixMilli()
			}
			b.Line = append(b.Line, w)
			user(j.User).Waiting++
		case !j.Over():
			u := user(j.User)
			u.Running++
			u.Devices += len(j.Devices)
		}
	}
	slices.SortFunc(b.Line, func(a, c ClusterWaiting) int {
		if a.Partition != c.Partition {
			return strings.Compare(a.Partition, c.Partition)
		}
		if a.Held != c.Held { // held ones last
			if a.Held {
				return 1
			}
			return -1
		}
		return a.Place - c.Place
	})
	for _, name := range slices.Sorted(maps.Keys(users)) {
		b.Users = append(b.Users, *users[name])
	}
	return b, nil
}

// boardAnswer is a node's board, or why it did not answer.
type boardAnswer struct {
	b   *wire.Board
	err error
}

// maxBoardAsks bounds the boards asked at once (each answer may be
// fetch.DefaultMax).
const maxBoardAsks = 32

// askBoards asks every node's npuboard for its /api/status, at most
// maxBoardAsks at once; each answer comes on the node's channel, each
// within timeout of its asking.
func askBoards(urls map[string]string, timeout time.Duration) map[string]chan boardAnswer {
	out := make(map[string]chan boardAnswer, len(urls))
	client := fetch.Client(timeout)
	asks := make(chan struct{}, maxBoardAsks)
	for node, url := range urls {
		ch := make(chan boardAnswer, 1)
		out[node] = ch
		go func() {
			asks <- struct{}{}
			defer func() { <-asks }()
			var b wire.Board
			err := fetch.JSON(client, url+"/api/status", timeout, fetch.DefaultMax, &b)
			if err == nil && (b.Time == 0 || b.Devices == nil) {
				err = errors.New("answered what is not a broker's board (no devices)")
			}
			if err != nil {
				ch <- boardAnswer{err: err}
				return
			}
			ch <- boardAnswer{b: &b}
		}()
	}
	return out
}

// gresCount is how many devices of gres a node's GRES ("gpu:4",
// "gpu:910b:8(S:0)", "gpu:2,shard:8") has.
func gresCount(gres, name string) int {
	for _, g := range strings.Split(gres, ",") {
		g, _, _ = strings.Cut(g, "(")
		f := strings.Split(g, ":")
		if len(f) >= 2 && f[0] == name {
			n, err := strconv.Atoi(f[len(f)-1])
			if err == nil && n >= 0 && n <= 1024 {
				return n
			}
		}
	}
	return 0
}

// writeClusterBoard writes status --cluster's tables.
func writeClusterBoard(env Env, b *ClusterBoard) error {
	now := time.UnixMilli(b.Time)
	tw := tabwriter.NewWriter(env.Stdout, 0, 8, 2, ' ', 0)
	header := false
	for _, n := range b.Nodes {
		if n.Status != nil {
			continue // below, from its board
		}
		if !header {
			fmt.Fprintln(tw, "NODE\tDEVICE\tSTATE\tJOB\tUSER\tSINCE\tCOMMAND")
			header = true
		}
		if len(n.Devices) == 0 {
			fmt.Fprintf(tw, "%s\t-\t%s\t-\t-\t-\t%s\n", n.Name, nodeState(&n), oneLine(n.Reason))
		}
		for _, d := range n.Devices {
			switch {
			case d.Job != 0:
				state := "held"
				if n.Down {
					state = nodeState(&n)
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\t%s\n", n.Name, d.Index, state, d.Job, d.User, since(now, d.Since), oneLine(d.Command))
			case n.Down:
				fmt.Fprintf(tw, "%s\t%d\t%s\t-\t-\t-\t%s\n", n.Name, d.Index, nodeState(&n), oneLine(n.Reason))
			default:
				fmt.Fprintf(tw, "%s\t%d\tfree\t-\t-\t-\t\n", n.Name, d.Index)
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range b.Nodes {
		if n.BoardDown != "" {
			fmt.Fprintf(env.Stdout, "%s: board down, from Slurm (%s: %s)\n", n.Name, oneLine(n.Board), oneLine(n.BoardDown))
		}
	}
	for i, n := range b.Nodes {
		if n.Status == nil {
			continue
		}
		if header || i > 0 {
			fmt.Fprintln(env.Stdout)
		}
		fmt.Fprintf(env.Stdout, "%s: %s, from its board (%s)\n", n.Name, nodeState(&n), oneLine(n.Board))
		if _, err := io.WriteString(env.Stdout, Table(n.Status, termWidth(env), now)); err != nil {
			return err
		}
	}
	if len(b.Line) > 0 {
		fmt.Fprintln(env.Stdout)
		fmt.Fprintln(tw, "LINE\tJOB\tUSER\tPARTITION\tASKS\tWAITING\tSTART\tCOMMAND")
		for _, w := range b.Line {
			place := wire.Ordinal(w.Place)
			if w.Held {
				place = "held"
			}
			start := "-"
			if w.Start != 0 {
				start = "est. " + time.UnixMilli(w.Start).In(now.Location()).Format("15:04")
			}
			why := ""
			if w.Reason != "" {
				why = " (" + w.Reason + ")"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s%s\n", place, w.Job, w.User, w.Partition, orDash(w.Devices), since(now, w.Submitted), start, oneLine(w.Command), why)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(b.Users) > 0 {
		fmt.Fprintln(env.Stdout)
		fmt.Fprintln(tw, "USER\tDEVICES\tRUNNING\tWAITING")
		for _, u := range b.Users {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", u.User, u.Devices, u.Running, u.Waiting)
		}
	}
	return tw.Flush()
}

// nodeState is "down" for a node that takes no work (with Slurm's word
// where it is another), else Slurm's state.
func nodeState(n *ClusterNode) string {
	if n.Down && !strings.HasPrefix(n.State, "down") {
		return "down (" + n.State + ")"
	}
	if n.Down {
		return "down"
	}
	return n.State
}

func since(now time.Time, ms int64) string {
	if ms <= 0 {
		return "-"
	}
	return quantity.Approx(now.Sub(time.UnixMilli(ms)))
}

func oneLine(s string) string {
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f }), " ")
}
