package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// standIn is the workload run under another name (a link named python,
// torchrun, make or bench.sh): a stand-in for a user's program in the
// documents' examples (tests/docs/docs_test.go), whose command line /proc shows
// as the example's ("python train.py"). It says nothing and exits 0, unless
// NPURUN_STANDIN says otherwise:
//
//	hold     say "held ARGS" and wait until standard input closes
//	forever  wait until a signal ends it (a task's command, cancelled)
//
// NPURUN_STANDIN_CHILDREN=N first starts N children of the same name that
// wait until a signal ends them, holding whatever lease it holds.
func standIn() {
	args := strings.Join(os.Args[1:], " ")
	if n, _ := strconv.Atoi(os.Getenv("NPURUN_STANDIN_CHILDREN")); n > 0 {
		self, err := os.Executable()
		if err != nil {
			fmt.Fprintln(os.Stderr, "stand-in:", err)
			os.Exit(4)
		}
		for range n {
			child := &exec.Cmd{Path: self, Args: os.Args, Env: append(os.Environ(), "NPURUN_STANDIN_CHILDREN=", "NPURUN_STANDIN=forever")}
			if err := child.Start(); err != nil {
				fmt.Fprintln(os.Stderr, "stand-in:", err)
				os.Exit(4)
			}
		}
	}
	switch os.Getenv("NPURUN_STANDIN") {
	case "hold":
		fmt.Println("held " + args)
		io.Copy(io.Discard, os.Stdin)
	case "forever":
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
		<-sig
		os.Exit(143)
	}
}

// standInNames are the names the documents' examples run the workload
// under (tests/docs/docs_test.go links them). Other copies of it (a set-user-ID
// copy, a supervisor's stand-in) are the workload itself.
var standInNames = map[string]bool{"python": true, "torchrun": true, "make": true, "bench.sh": true}

// standInName tells whether the workload runs as a stand-in: under one of
// standInNames.
func standInName() bool {
	return standInNames[filepath.Base(os.Args[0])]
}
