package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// markShares is a share's run proving the packing itself: for each of
// devs, under an flock of the device's ledger file in markers, it sums
// the declarations of the shares running there (one file each, npuN.mem.
// PID holding its MiB), adds its own, and fails (exit 3, OVER CAPACITY)
// if they declare more than capacity, or DOUBLE GRANT (exit 3) if a run
// holds the device whole (its marker npuN). It returns its files, removed when
// it ends (under the same lock, by unmark).
func markShares(markers, tag, devs string, mem, capacity int64) []string {
	var made []string
	for _, id := range strings.Split(devs, ",") {
		err := underLock(filepath.Join(markers, "npu"+id+".lock"), func() error {
			ents, err := os.ReadDir(markers)
			if err != nil {
				return err
			}
			sum := mem
			if _, err := os.Stat(filepath.Join(markers, "npu"+id)); err == nil {
				fmt.Fprintf(os.Stderr, "workload %s: DOUBLE GRANT of npu %s: a share beside a whole lease\n", tag, id)
				os.Exit(3)
			}
			for _, e := range ents {
				if !strings.HasPrefix(e.Name(), "npu"+id+".mem.") {
					continue
				}
				b, err := os.ReadFile(filepath.Join(markers, e.Name()))
				if errors.Is(err, os.ErrNotExist) {
					continue // that run has just ended
				}
				if err != nil {
					return err
				}
				n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				sum += n
			}
			if capacity > 0 && sum > capacity {
				fmt.Fprintf(os.Stderr, "workload %s: OVER CAPACITY of npu %s: %d MiB declared of %d\n", tag, id, sum, capacity)
				os.Exit(3)
			}
			p := filepath.Join(markers, "npu"+id+".mem."+strconv.Itoa(os.Getpid()))
			made = append(made, p)
			return os.WriteFile(p, []byte(strconv.FormatInt(mem, 10)+"\n"), 0o644)
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, "workload:", err)
			os.Exit(4)
		}
	}
	return made
}

// underLock runs f holding an flock of path.
func underLock(path string, f func() error) error {
	// Read-only: the runs of other users lock it too, and the umask takes
	// the write bits of whatever mode it is made with.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		return err
	}
	return f()
}

// markWhole is a whole lease's run proving its exclusivity: for each of
// devs, under the same lock of the device's ledger file as markShares, it
// fails (exit 3, DOUBLE GRANT) if a share's run is there or another whole
// run made its O_EXCL marker npuN. It returns its markers.
func markWhole(markers, tag, devs string) []string {
	var made []string
	for _, id := range strings.Split(devs, ",") {
		err := underLock(filepath.Join(markers, "npu"+id+".lock"), func() error {
			ents, err := os.ReadDir(markers)
			if err != nil {
				return err
			}
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), "npu"+id+".mem.") {
					fmt.Fprintf(os.Stderr, "workload %s: DOUBLE GRANT of npu %s: a whole lease beside a share (%s)\n", tag, id, e.Name())
					os.Exit(3)
				}
			}
			p := filepath.Join(markers, "npu"+id)
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				fmt.Fprintf(os.Stderr, "workload %s: DOUBLE GRANT of npu %s: %v\n", tag, id, err)
				os.Exit(3)
			}
			made = append(made, p)
			return f.Close()
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, "workload:", err)
			os.Exit(4)
		}
	}
	return made
}
