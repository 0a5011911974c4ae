// Package status is what npubroker status reports, in a room of its own:
// the ledger of leases (the lease table's record of each grant joined with
// who /proc shows holding it now), the looks at the holders and the
// background scan with the unleased use it finds, the accounting log and
// npubroker usage, the board and its watchers, the Prometheus metrics, and
// the devices' utilization joined to the leases (kept across a restart in
// the state directory's util.json); at start, the leases held from before, taken up from the accounting log
// (or the Slurm room's job records, or found in /proc: a Slurm job's where
// its extern step holds it) and handed to the lease table to adopt. The
// broker tells it of each grant, release and change (Started, Ended,
// Changed), and of npurun-runtime's word on a lease's container (Contain,
// ContainerNamed: a label on the ledger's entry, never the lease table's
// record); it reads the lease table, the tasks and a Slurm node's jobs
// through the views it declares (Table, Tasks, Jobs), which hand it
// copies. Its lock guards the ledger alone and is the last one taken: it
// must never be held while the room calls another room, reads /proc,
// looks up an account, writes a log line or a file, or signals a process;
// and the room must never change a lease or a task, nor touch a socket
// but its metrics endpoint's.
package status
