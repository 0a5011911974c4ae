package packaging

// The Makefile stamps install paths and the version into the programs with
// the Go linker's -X pkg.Var=value. The linker ignores, without a word, an
// -X that names no variable, or one it cannot set (a variable initialised
// by a function call, or not a string): after a package move the packaged
// npubroker kept its default supervisor path and refused every task. This
// test reads the Makefile's go build lines and checks each -X against the
// source, type-checked.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// ldflagsX is one -X flag of one go build line of the Makefile.
type ldflagsX struct {
	pkg     string // import path; main resolved to the package built
	name    string // the variable
	line    int    // the Makefile's line (of the logical line's start)
	asWrote string // pkg.Var as the Makefile writes it
}

func TestMakefileLdflagsXNameStringVariables(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go in PATH: %v", err)
	}
	root := ldflagsModuleRoot(t, goTool)
	src, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	flags, written := ldflagsParseMakefile(t, string(src))

	// Every -X written in the Makefile must be on a go build line that
	// this test understood: none may slip past unchecked.
	checked := map[string]bool{}
	for _, f := range flags {
		checked[f.asWrote] = true
	}
	for _, w := range written {
		if !checked[w] {
			t.Errorf("Makefile: -X %s is not on a go build line this test could read (a variable used by no build line?)", w)
		}
	}
	// The Makefile stamps at least the version and the two install
	// paths; a parse that finds fewer has gone wrong.
	for _, want := range []string{"main.version", "InstalledBroker", "InstalledSupervisor"} {
		found := false
		for _, f := range flags {
			if strings.HasSuffix(f.asWrote, want) {
				found = true
			}
		}
		if !found {
			t.Errorf("Makefile: found no -X ...%s on a go build line (flags found: %v)", want, flags)
		}
	}

	pkgs := map[string]bool{}
	for _, f := range flags {
		pkgs[f.pkg] = true
	}
	paths := make([]string, 0, len(pkgs))
	for p := range pkgs {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	listed := ldflagsGoList(t, goTool, root, paths)

	for _, f := range flags {
		where := fmt.Sprintf("Makefile:%d: -X %s", f.line, f.asWrote)
		lp, ok := listed[f.pkg]
		if !ok || lp.Error != nil || (len(lp.GoFiles) == 0 && len(lp.CgoFiles) == 0) {
			msg := "not found"
			if ok && lp.Error != nil {
				msg = lp.Error.Err
			}
			t.Errorf("%s: package %s: %s", where, f.pkg, msg)
			continue
		}
		if err := ldflagsCheckVar(lp, listed, f.name); err != nil {
			t.Errorf("%s: %v", where, err)
		}
	}
}

// ldflagsModuleRoot is the directory of the main module's go.mod.
func ldflagsModuleRoot(t *testing.T, goTool string) string {
	t.Helper()
	out, err := exec.Command(goTool, "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatal("go env GOMOD: not in a module")
	}
	return filepath.Dir(gomod)
}

var (
	ldflagsAssign = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)\s*(\?=|:=|::=|=)\s*(.*)$`)
	ldflagsRef    = regexp.MustCompile(`\$[({]([A-Za-z_][A-Za-z0-9_]*)[)}]`)
	ldflagsXFlag  = regexp.MustCompile(`-X[= ]\s*([^\s"'=]+)=`)
	ldflagsBuild  = regexp.MustCompile(`(?:^|\s)(?:\$\(GO\)|go)\s+build\s`)
	ldflagsTarget = regexp.MustCompile(`(?:^|\s)(\./[^\s"']+)`)
)

// ldflagsParseMakefile returns the -X flags of the Makefile's go build
// recipe lines, with the Makefile's simple variables expanded and main
// resolved to the package each line builds, and every pkg.Var that an -X
// in the Makefile's text names, expanded or not.
func ldflagsParseMakefile(t *testing.T, src string) (flags []ldflagsX, written []string) {
	t.Helper()
	type logical struct {
		text string
		line int
	}
	var lines []logical
	var cur strings.Builder
	start := 0
	for i, l := range strings.Split(src, "\n") {
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.HasSuffix(l, "\\") {
			cur.WriteString(strings.TrimSuffix(l, "\\"))
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(l)
		lines = append(lines, logical{cur.String(), start})
		cur.Reset()
	}

	vars := map[string]string{}
	for _, l := range lines {
		if strings.HasPrefix(l.text, "\t") || strings.HasPrefix(strings.TrimSpace(l.text), "#") {
			continue
		}
		m := ldflagsAssign.FindStringSubmatch(strings.TrimSpace(l.text))
		if m == nil {
			continue
		}
		if _, set := vars[m[1]]; set && m[2] == "?=" {
			continue
		}
		vars[m[1]] = m[3]
	}
	var expand func(s string, depth int) string
	expand = func(s string, depth int) string {
		if depth > 20 {
			t.Fatalf("Makefile: variables nest too deep expanding %q", s)
		}
		return ldflagsRef.ReplaceAllStringFunc(s, func(ref string) string {
			name := ldflagsRef.FindStringSubmatch(ref)[1]
			if v, ok := vars[name]; ok {
				return expand(v, depth+1)
			}
			return ref // an automatic or unknown variable: left as written
		})
	}

	seen := map[string]bool{}
	for _, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l.text), "#") {
			continue
		}
		for _, m := range ldflagsXFlag.FindAllStringSubmatch(l.text, -1) {
			if !seen[m[1]] {
				seen[m[1]] = true
				written = append(written, m[1])
			}
		}
		if !strings.HasPrefix(l.text, "\t") {
			continue
		}
		text := expand(l.text, 0)
		if !ldflagsBuild.MatchString(text) {
			continue
		}
		xs := ldflagsXFlag.FindAllStringSubmatch(text, -1)
		if len(xs) == 0 {
			continue
		}
		var targets []string
		for _, m := range ldflagsTarget.FindAllStringSubmatch(text, -1) {
			targets = append(targets, m[1])
		}
		for _, m := range xs {
			full := m[1]
			dot := strings.LastIndex(full, ".")
			if dot <= 0 || dot == len(full)-1 {
				t.Errorf("Makefile:%d: -X %s: not pkg.Var", l.line, full)
				continue
			}
			pkg, name := full[:dot], full[dot+1:]
			if pkg != "main" {
				flags = append(flags, ldflagsX{pkg: pkg, name: name, line: l.line, asWrote: full})
				continue
			}
			if len(targets) != 1 {
				t.Errorf("Makefile:%d: -X %s: the line builds %d packages (%v), want one to resolve main", l.line, full, len(targets), targets)
				continue
			}
			flags = append(flags, ldflagsX{pkg: targets[0], name: name, line: l.line, asWrote: full})
		}
	}
	return flags, written
}

// ldflagsPkg is what go list -json says of a package.
type ldflagsPkg struct {
	ImportPath string
	Dir        string
	Name       string
	GoFiles    []string
	CgoFiles   []string
	Export     string
	Error      *struct{ Err string }
}

// ldflagsGoList lists the packages named (import paths, or ./dir relative
// to the module root) and their dependencies, with export data built.
// Each named package is also keyed as it was named.
func ldflagsGoList(t *testing.T, goTool, root string, named []string) map[string]*ldflagsPkg {
	t.Helper()
	args := append([]string{"list", "-e", "-export", "-deps", "-json"}, named...)
	cmd := exec.Command(goTool, args...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", named, err, stderr.Bytes())
	}
	all := map[string]*ldflagsPkg{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := new(ldflagsPkg)
		if err := dec.Decode(p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list: %v", err)
		}
		all[p.ImportPath] = p
	}
	// Key each named package as named too (./cmd/npurun, a path that may
	// not exist: then it stays missing, which the caller reports).
	for _, n := range named {
		if !strings.HasPrefix(n, "./") {
			continue
		}
		dir := filepath.Join(root, filepath.FromSlash(n))
		for _, p := range all {
			if p.Dir == dir {
				all[n] = p
			}
		}
	}
	return all
}

// ldflagsCheckVar type-checks the package's files (its imports from their
// export data) and says what is wrong with name as a target of -X: none
// such at package level, not a variable, not a string, or initialised by
// an expression that is not constant (the linker leaves those alone).
func ldflagsCheckVar(p *ldflagsPkg, all map[string]*ldflagsPkg, name string) error {
	fset := token.NewFileSet()
	var files []*ast.File
	for _, f := range append(append([]string{}, p.GoFiles...), p.CgoFiles...) {
		af, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files = append(files, af)
	}
	lookup := func(path string) (io.ReadCloser, error) {
		dep, ok := all[path]
		if !ok || dep.Export == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(dep.Export)
	}
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Defs: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", lookup), FakeImportC: true}
	tp, err := conf.Check(p.ImportPath, fset, files, info)
	if err != nil {
		return fmt.Errorf("type-checking %s: %v", p.ImportPath, err)
	}
	obj := tp.Scope().Lookup(name)
	if obj == nil {
		return fmt.Errorf("package %s declares no %s at package level", p.ImportPath, name)
	}
	v, ok := obj.(*types.Var)
	if !ok {
		return fmt.Errorf("%s.%s is a %T, not a variable", p.ImportPath, name, obj)
	}
	if !types.Identical(v.Type(), types.Typ[types.String]) {
		return fmt.Errorf("%s.%s is a %s, not a string", p.ImportPath, name, v.Type())
	}
	for _, f := range files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if info.Defs[id] != obj {
						continue
					}
					if len(vs.Values) == 0 {
						return nil
					}
					if len(vs.Values) != len(vs.Names) {
						return fmt.Errorf("%s: %s.%s is set by a call, which -X cannot change", fset.Position(id.Pos()), p.ImportPath, name)
					}
					if info.Types[vs.Values[i]].Value == nil {
						return fmt.Errorf("%s: %s.%s is initialised by an expression that is not constant, which -X cannot change", fset.Position(id.Pos()), p.ImportPath, name)
					}
					return nil
				}
			}
		}
	}
	return fmt.Errorf("%s.%s: its declaration not found", p.ImportPath, name)
}
