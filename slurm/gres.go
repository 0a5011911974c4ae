// Package slurm is npurun's side of a Slurm node: gres.conf read and
// checked against npurun's map, and the Prolog's and Epilog's word to the
// broker. It talks to the broker only over the wire and must never import
// the daemon (broker/...).
package slurm

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultGresConf is where Slurm reads gres.conf when SLURM_CONF does not
// say otherwise (gres.conf lives beside slurm.conf).
const DefaultGresConf = "/etc/slurm/gres.conf"

// GresConfPath is the gres.conf to compare with: configured, else beside
// $SLURM_CONF (getenv reads it), else DefaultGresConf.
func GresConfPath(configured string, getenv func(string) string) string {
	if configured != "" {
		return configured
	}
	if c := getenv("SLURM_CONF"); c != "" {
		return filepath.Join(filepath.Dir(c), "gres.conf")
	}
	return DefaultGresConf
}

// maxGresFiles bounds the device files one gres.conf may expand to.
const maxGresFiles = 4096

// GresFile is one device file of a GRES on this node, at its position:
// the index Slurm gives it in SLURM_JOB_GPUS.
type GresFile struct {
	Position int
	Path     string
	Line     int // gres.conf's line that names it
}

// Gres is what gres.conf says about one GRES name on one node.
type Gres struct {
	Files      []GresFile // in position order
	AutoDetect string     // a detection mechanism (nvml, rsmi, ...) that may add or reorder devices; "" or "off" for none
	Records    int        // records of the name for the node
	Notes      []string   // what was skipped, and why
}

// ParseGres reads gres.conf's records of GRES name for node (records of
// other nodes are skipped) and returns their device files in the order
// Slurm numbers them: record after record, each File= expanded as
// Slurm's host lists expand ("/dev/davinci[4-7]" is davinci4 to 7).
func ParseGres(data []byte, name, node string) (*Gres, error) {
	g := &Gres{}
	lines := strings.Split(string(data), "\n")
	for i := 0; i < len(lines); i++ {
		n := i + 1
		line := stripComment(lines[i])
		for strings.HasSuffix(line, "\\") && i+1 < len(lines) { // continued
			i++
			line = strings.TrimSuffix(line, "\\") + " " + stripComment(lines[i])
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		rec := map[string]string{}
		for _, f := range fields {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				return nil, fmt.Errorf("line %d: %q is not KEY=VALUE", n, f)
			}
			rec[strings.ToLower(k)] = strings.Trim(v, `"`)
		}
		if strings.EqualFold(fields[0], "include") || rec["include"] != "" {
			g.Notes = append(g.Notes, fmt.Sprintf("line %d: Include is not followed", n))
			continue
		}
		if ad, ok := rec["autodetect"]; ok && rec["name"] == "" {
			if nodes, has := rec["nodename"]; !has || matchNode(nodes, node) {
				g.AutoDetect = ad // a global or per-node AutoDetect line
			}
			continue
		}
		if rec["name"] != name {
			continue
		}
		if nodes, has := rec["nodename"]; has && !matchNode(nodes, node) {
			continue
		}
		if ad, ok := rec["autodetect"]; ok {
			g.AutoDetect = ad
		}
		g.Records++
		file := rec["file"]
		if file == "" {
			file = rec["files"]
		}
		if rec["multiplefiles"] != "" {
			g.Notes = append(g.Notes, fmt.Sprintf("line %d: MultipleFiles= (one GRES of several files) is not compared", n))
			continue
		}
		if file == "" {
			g.Notes = append(g.Notes, fmt.Sprintf("line %d: a record of %q without File=: its devices have no files to compare", n, name))
			continue
		}
		paths, err := ExpandHostlist(file)
		if err != nil {
			return nil, fmt.Errorf("line %d: File=%s: %w", n, file, err)
		}
		for _, p := range paths {
			if len(g.Files) >= maxGresFiles {
				return nil, fmt.Errorf("line %d: more than %d device files", n, maxGresFiles)
			}
			g.Files = append(g.Files, GresFile{Position: len(g.Files), Path: p, Line: n})
		}
	}
	return g, nil
}

// ReadGres reads gres.conf at path (as ParseGres).
func ReadGres(path, name, node string) (*Gres, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	g, err := ParseGres(data, name, node)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return g, nil
}

func stripComment(s string) string {
	if i := strings.IndexByte(s, '#'); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

// matchNode tells whether node is in the host list nodes.
func matchNode(nodes, node string) bool {
	names, err := ExpandHostlist(nodes)
	if err != nil {
		return false
	}
	for _, n := range names {
		if n == node {
			return true
		}
	}
	return false
}

// ExpandHostlist expands a Slurm host list such as "tux[0-3,7],login" or
// "/dev/davinci[04-07]" into its names, in the order written; numbers
// keep the width of a range's first bound ("[04-07]": 04, 05, 06, 07).
func ExpandHostlist(s string) ([]string, error) {
	var out []string
	for _, item := range splitOutside(s) {
		if item == "" {
			return nil, fmt.Errorf("empty name in %q", s)
		}
		names, err := expandOne(item)
		if err != nil {
			return nil, err
		}
		out = append(out, names...)
		if len(out) > maxGresFiles {
			return nil, fmt.Errorf("%q names more than %d", s, maxGresFiles)
		}
	}
	return out, nil
}

// splitOutside splits s at the commas outside brackets.
func splitOutside(s string) []string {
	var parts []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, s[start:])
}

// expandOne expands the bracket groups of one name.
func expandOne(s string) ([]string, error) {
	open := strings.IndexByte(s, '[')
	if open < 0 {
		if strings.ContainsRune(s, ']') {
			return nil, fmt.Errorf("unbalanced ] in %q", s)
		}
		return []string{s}, nil
	}
	end := strings.IndexByte(s[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("unbalanced [ in %q", s)
	}
	end += open
	prefix, body, rest := s[:open], s[open+1:end], s[end+1:]
	tails, err := expandOne(rest)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range strings.Split(body, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, errA := strconv.Atoi(lo)
		b := a
		var errB error
		if isRange {
			b, errB = strconv.Atoi(hi)
		}
		if lo == "" || errA != nil || errB != nil || a < 0 || b < a {
			return nil, fmt.Errorf("bad range %q in %q", r, s)
		}
		if (b-a+1)*len(tails) > maxGresFiles {
			return nil, fmt.Errorf("%q names more than %d", s, maxGresFiles)
		}
		for v := a; v <= b; v++ {
			num := strconv.Itoa(v)
			for len(num) < len(lo) {
				num = "0" + num
			}
			for _, t := range tails {
				out = append(out, prefix+num+t)
			}
		}
		if len(out) > maxGresFiles {
			return nil, fmt.Errorf("%q names more than %d", s, maxGresFiles)
		}
	}
	return out, nil
}
