package main

import (
	"reflect"
	"testing"

	"github.com/npurun/npurun/internal/completion"
)

// TestCompletionOptions: the completion scripts see each command's options
// as its flag set parses them, from the same table (serveOptions,
// checkConfigOptions, cli.StatusOptions ...), with what completes each
// value.
func TestCompletionOptions(t *testing.T) {
	type opt struct {
		short    byte
		long     string
		takes    bool
		complete completion.Kind
	}
	want := map[string][]opt{
		"serve": {{0, "cgroup", true, completion.Dirs}, {0, "config", true, completion.Files}, {0, "log", true, completion.None},
			{0, "run-dir", true, completion.Dirs}, {0, "socket", true, completion.Files}, {0, "state-dir", true, completion.Dirs}, {'h', "help", false, completion.None}},
		"check-config": {{0, "socket", true, completion.Files}, {'h', "help", false, completion.None}},
		"status":       {{0, "json", false, completion.None}, {0, "socket", true, completion.Files}, {'w', "watch", false, completion.None}, {0, "cluster", false, completion.None}, {'h', "help", false, completion.None}},
		"usage": {{0, "by", true, completion.None}, {0, "json", false, completion.None}, {0, "since", true, completion.None}, {0, "socket", true, completion.Files},
			{0, "user", true, completion.Users}, {'h', "help", false, completion.None}},
		"drain":   {{0, "json", false, completion.None}, {0, "reason", true, completion.None}, {0, "socket", true, completion.Files}, {'h', "help", false, completion.None}},
		"undrain": {{0, "json", false, completion.None}, {0, "socket", true, completion.Files}, {'h', "help", false, completion.None}},
		"reload":  {{0, "json", false, completion.None}, {0, "socket", true, completion.Files}, {'h', "help", false, completion.None}},
	}
	c := completionCommand()
	if len(c.Subcommands) != len(want) {
		t.Errorf("%d subcommands, want %d", len(c.Subcommands), len(want))
	}
	for _, s := range c.Subcommands {
		var got []opt
		for _, o := range s.Options {
			got = append(got, opt{o.Short, o.Long, o.Value != "", o.Complete})
		}
		if !reflect.DeepEqual(got, want[s.Name]) {
			t.Errorf("%s: options %+v, want %+v", s.Name, got, want[s.Name])
		}
	}
}
