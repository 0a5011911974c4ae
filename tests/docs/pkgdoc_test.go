package docs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

const modulePath = "github.com/npurun/npurun"

// goPackage is what TestPackageDocs reads of `go list -json`.
type goPackage struct {
	ImportPath string
	Name       string
	Dir        string
	Doc        string
	GoFiles    []string
	CgoFiles   []string
}

// TestPackageDocs checks CONVENTIONS.md's rule on package docs, and that
// the README's Layout table names every package: each package of the
// module that has Go files (test-only packages aside) has exactly one doc
// comment, "Package <name> ..." (a main's "Command <dir> ..."), and each
// outside tests/ is a path in the first column of the Layout table.
func TestPackageDocs(t *testing.T) {
	out, err := exec.Command("go", "list", "-e", "-json", modulePath+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs, err := decodePackages(out)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(harness.Root(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	layout := layoutPaths(string(readme))
	if len(layout) == 0 {
		t.Fatal("README.md: no Layout table found (a \"## Layout\" section with a table)")
	}
	for _, msg := range checkPackageDocs(pkgs, layout) {
		t.Error(msg)
	}
}

// TestPackageDocsFails shows that the check of TestPackageDocs fails on
// each thing it is there to catch.
func TestPackageDocsFails(t *testing.T) {
	layout := map[string]bool{"npu": true, "cmd/npurun": true}
	dir := t.TempDir()
	write := func(name, src string) string {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return name
	}
	good := goPackage{ImportPath: modulePath + "/npu", Name: "npu", Dir: dir,
		Doc:     "Package npu finds the accelerators.",
		GoFiles: []string{write("a.go", "// Package npu finds the accelerators.\npackage npu\n")}}
	if msgs := checkPackageDocs([]goPackage{good}, layout); len(msgs) != 0 {
		t.Fatalf("a good package is refused: %q", msgs)
	}
	for _, c := range []struct {
		name string
		pkg  goPackage
		want string
	}{
		{"no doc", goPackage{ImportPath: modulePath + "/npu", Name: "npu", Dir: dir,
			GoFiles: []string{write("b.go", "package npu\n")}}, "has no doc comment"},
		{"wrong start", goPackage{ImportPath: modulePath + "/npu", Name: "npu", Dir: dir,
			Doc:     "Finds the accelerators.",
			GoFiles: []string{write("c.go", "// Finds the accelerators.\npackage npu\n")}}, `does not start with "Package npu "`},
		{"two docs", goPackage{ImportPath: modulePath + "/npu", Name: "npu", Dir: dir,
			Doc:     "Package npu finds the accelerators.",
			GoFiles: []string{"a.go", write("d.go", "// Package npu is another doc.\npackage npu\n")}}, "has 2 doc comments"},
		{"main", goPackage{ImportPath: modulePath + "/cmd/npurun", Name: "main", Dir: dir,
			Doc:     "Package main runs npurun.",
			GoFiles: []string{write("e.go", "// Package main runs npurun.\npackage main\n")}}, `does not start with "Command npurun "`},
		{"not in layout", goPackage{ImportPath: modulePath + "/internal/newthing", Name: "newthing", Dir: dir,
			Doc:     "Package newthing is new.",
			GoFiles: []string{write("f.go", "// Package newthing is new.\npackage newthing\n")}}, "README.md's Layout table"},
	} {
		msgs := checkPackageDocs([]goPackage{c.pkg}, layout)
		if len(msgs) != 1 || !strings.Contains(msgs[0], c.want) {
			t.Errorf("%s: got %q, want one message containing %q", c.name, msgs, c.want)
		}
	}
}

func decodePackages(out []byte) ([]goPackage, error) {
	var pkgs []goPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p goPackage
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			return pkgs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("go list -json: %w", err)
		}
		pkgs = append(pkgs, p)
	}
}

// layoutPaths returns the paths named (in backquotes) in the first column
// of the table under README's "## Layout".
func layoutPaths(readme string) map[string]bool {
	paths := map[string]bool{}
	_, section, ok := strings.Cut(readme, "\n## Layout\n")
	if !ok {
		return paths
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	quoted := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "|") || len(cells) < 3 {
			continue
		}
		for _, m := range quoted.FindAllStringSubmatch(cells[1], -1) {
			paths[m[1]] = true
		}
	}
	return paths
}

func checkPackageDocs(pkgs []goPackage, layout map[string]bool) []string {
	var msgs []string
	for _, p := range pkgs {
		files := append(append([]string{}, p.GoFiles...), p.CgoFiles...)
		if len(files) == 0 {
			continue // tests only, or no file for this platform
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, modulePath), "/")
		want := "Package " + p.Name + " "
		if p.Name == "main" {
			want = "Command " + path.Base(p.ImportPath) + " "
		}
		docs := 0
		fset := token.NewFileSet()
		for _, name := range files {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				msgs = append(msgs, fmt.Sprintf("%s: %v", rel, err))
				continue
			}
			if f.Doc != nil {
				docs++
			}
		}
		switch {
		case p.Doc == "" || docs == 0:
			msgs = append(msgs, fmt.Sprintf("%s has no doc comment (CONVENTIONS.md: %q what it owns, and what it must never do)", rel, want+"..."))
		case docs > 1:
			msgs = append(msgs, fmt.Sprintf("%s has %d doc comments, not one (CONVENTIONS.md)", rel, docs))
		case !strings.HasPrefix(p.Doc, want):
			msgs = append(msgs, fmt.Sprintf("%s: doc %q does not start with %q", rel, p.Doc, want))
		}
		if !strings.HasPrefix(rel, "tests/") && rel != "tests" && !layout[rel] {
			msgs = append(msgs, fmt.Sprintf("%s is not in README.md's Layout table: add a row (path, what lives there, what it may import)", rel))
		}
	}
	return msgs
}
