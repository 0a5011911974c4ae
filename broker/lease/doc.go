// Package lease is the broker's lease table: it owns the devices and their
// lock files (a fresh file for every lease), the watchers that see a
// lease's lock go, the line of requests and the order it is served in
// (Plan: fairness across users, reservations, backfill), the per-user caps,
// the admission of a request against the pools and its holder's limit, the
// record of each grant (Lease), and the leases found held at start. A
// request comes in as a holder (Holder: its kind, who, which process or
// task) and what it wants; Schedule hands out grants as Handovers whose
// devices are neither free nor leased until the owner, having delivered
// their descriptors, commits or returns them; the owner hears of releases
// through the Owner interface, and device access is a Gate the owner
// implements (opened before descriptors leave, closed after a lease and
// before the next grant, out of service while it cannot be closed). The
// table must never touch a socket, a task, PAM or /proc, nor wait, fork,
// write to disk or call its owner or gate while it holds its lock: the
// owner's lock comes first, the table's second, and nothing the table
// calls takes its own. A holder the broker does not start is a Kind
// with what names it in Holder: a Slurm job's lease (Slurm) is taken by
// Claim on the devices Slurm picked, outside the line's order, as is the
// grant of a request of a pool whose devices an allocator outside the
// table picks (Pool.External: it waits in line, reserving nothing, until
// it is claimed for). A device the configuration shares (Config.Capacity)
// holds one whole lease or shares (share.go): leases that each declared
// some of its memory (Request.Mem), each on a fresh lock file of its own,
// packed by Plan from the room each device has left (Room.Share), best
// fit; Device.Leases lists them. A drained device
// (Drain, Undrain: drain.go) is neither free for Plan nor leased: the
// lease on it runs on, no new one is granted, a request that only it
// could serve reserves nothing and is told why (Reason); the drains are
// kept in a file (Config.DrainFile), written under drainMu, a lock of
// its own taken before the table's and never held by a caller.
package lease
