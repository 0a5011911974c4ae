// Package lease is the broker's lease table: the devices and their lock
// files, the line of requests and the order it is served in (Plan), the
// per-user caps, the reservations, and the record of each grant. It knows
// nothing of sockets, tasks, PAM or /proc: a request comes in as a holder
// and what it wants, a grant goes out as descriptors to deliver, and the
// table's owner hears of releases through the interface it implements.
package lease
