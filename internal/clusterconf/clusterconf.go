// Package clusterconf tells, from npurun.conf's bytes alone, whether this
// machine sends its work to a cluster's scheduler (a [cluster] table): the
// one test of npurun's start (package shim, which links no TOML parser)
// and of task-submit's (package cluster, which then parses the file).
package clusterconf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Path is the npurun.conf that may send work to a cluster: $NPURUN_CONF,
// else /etc/npurun/npurun.conf.
func Path() string {
	if p := os.Getenv("NPURUN_CONF"); p != "" {
		return p
	}
	return "/etc/npurun/npurun.conf"
}

// MaxSize bounds what is read of the configuration.
const MaxSize = 1 << 20

// Read is the configuration at path, and whether it has a [cluster]
// table. No file, or one the caller may not read (a box's that only its
// broker reads), is no cluster and no error; one larger than MaxSize is
// an error.
func Read(path string) ([]byte, bool, error) {
	f, err := os.Open(path)
	switch {
	case errors.Is(err, os.ErrNotExist), errors.Is(err, os.ErrPermission):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("read config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	switch {
	case err != nil:
		return nil, false, fmt.Errorf("read config: %w", err)
	case len(data) > MaxSize:
		return nil, false, fmt.Errorf("read config: %s is larger than %d MiB", path, MaxSize>>20)
	}
	return data, HasCluster(data), nil
}

// HasCluster tells whether TOML text data has a table header of the
// [cluster] table or one under it ([cluster.boards]), spaces and a
// comment after it allowed: "[ cluster ]  # login node".
func HasCluster(data []byte) bool {
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		s := strings.TrimSpace(string(line))
		if !strings.HasPrefix(s, "[") || strings.HasPrefix(s, "[[") {
			continue
		}
		name, _, ok := strings.Cut(s[1:], "]")
		if !ok {
			continue
		}
		name = strings.TrimSpace(name)
		if name == "cluster" || strings.HasPrefix(name, "cluster.") || strings.HasPrefix(name, "cluster .") {
			return true
		}
	}
	return false
}
