package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestTopOptionsAreMain: npubroker's own options, which main reads by
// hand before a command, are those of topOptions, the table its script
// is written from: every option of the table is a case of main's switch,
// and every case that is an option is in the table.
func TestTopOptionsAreMain(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var cases []string
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == "main" {
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if cc, ok := n.(*ast.CaseClause); ok {
					for _, e := range cc.List {
						if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
							s, _ := strconv.Unquote(lit.Value)
							cases = append(cases, s)
						}
					}
				}
				return true
			})
		}
	}
	var names []string
	for _, o := range topOptions {
		names = append(names, "--"+o.Long)
		if o.Short != 0 {
			names = append(names, "-"+string(o.Short))
		}
	}
	for _, n := range names {
		if !slices.Contains(cases, n) {
			t.Errorf("main reads no %s, which topOptions has", n)
		}
	}
	for _, c := range cases {
		if strings.HasPrefix(c, "-") && !slices.Contains(names, c) {
			t.Errorf("main reads %s, which topOptions lacks", c)
		}
	}
	if len(cases) == 0 {
		t.Error("no case of main's switch found")
	}
}
