package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// task-submit's command line is parsed here rather than by a flag library:
// task-submit starts in front of every task, and pflag brings net, flag
// and encoding/csv with it, whose initialisation (0.6 to 0.9 ms of its 8
// here) is paid at every start, as npurun's shim/args.go says. The grammar
// is getopt's, as pflag's: short options may be grouped (-fq) and take
// their value attached or as the next word (-n2, -n 2); long ones take it
// after "=" or as the next word, and a switch takes "=true" or "=false";
// "--" ends the options. Submitting stops at the first word that is not an
// option (the command's own options are its own); the other commands take
// their options anywhere.

// flagDef is one option: its names, the name of its value ("" for a
// switch), its help, and what sets it.
type flagDef struct {
	short byte
	long  string
	value string
	help  string
	set   func(v string) error
}

// flagSet is one form's options, and what a parse found.
type flagSet struct {
	name         string // for messages: "task-submit", "task-submit list"
	defs         []*flagDef
	interspersed bool // options may follow other words

	changed map[string]bool // long names given
	args    []string        // the words that are not options
	dashAt  int             // len(args) when "--" came; -1 without one
}

func newFlags(name string, interspersed bool) *flagSet {
	return &flagSet{name: name, interspersed: interspersed, changed: map[string]bool{}, dashAt: -1}
}

// switchVar adds a switch (a flag without a value).
func (fs *flagSet) switchVar(p *bool, short byte, long, help string) {
	fs.defs = append(fs.defs, &flagDef{short: short, long: long, help: help, set: func(v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return err
		}
		*p = b
		return nil
	}})
}

// stringVar adds an option whose value is a string.
func (fs *flagSet) stringVar(p *string, short byte, long, value, help string) {
	fs.defs = append(fs.defs, &flagDef{short: short, long: long, value: value, help: help, set: func(v string) error {
		*p = v
		return nil
	}})
}

// listVar adds an option that may be given again, each value appended;
// split, when set, cuts each value at commas first.
func (fs *flagSet) listVar(p *[]string, short byte, long, value, help string, split bool) {
	fs.defs = append(fs.defs, &flagDef{short: short, long: long, value: value, help: help, set: func(v string) error {
		if split {
			*p = append(*p, strings.Split(v, ",")...)
		} else {
			*p = append(*p, v)
		}
		return nil
	}})
}

// intVar adds an option whose value is a decimal integer (-n 010 is ten,
// as a person means it, not eight).
func (fs *flagSet) intVar(p *int, short byte, long, value, help string) {
	fs.defs = append(fs.defs, &flagDef{short: short, long: long, value: value, help: help, set: func(v string) error {
		n, err := strconv.ParseInt(v, 10, strconv.IntSize)
		if err != nil {
			return errors.New("not a whole number such as 2")
		}
		*p = int(n)
		return nil
	}})
}

// durationVar adds an option whose value is a duration (6h, 90m) of at
// most max; a longer one is refused as longer than what.
func (fs *flagSet) durationVar(p *time.Duration, short byte, long, value, help string, max time.Duration, what string) {
	fs.defs = append(fs.defs, &flagDef{short: short, long: long, value: value, help: help, set: func(v string) error {
		d, err := time.ParseDuration(v)
		if err == nil && d > max || err != nil && hugeDuration(v) {
			return fmt.Errorf("longer than %s", what)
		}
		if err != nil {
			return err
		}
		*p = d
		return nil
	}})
}

// hugeDuration tells whether s, which time.ParseDuration refused, is a
// well-formed positive duration: then it was refused for its size alone
// (beyond 2562047h, where it says only "invalid duration").
func hugeDuration(s string) bool {
	s = strings.TrimPrefix(s, "+")
	if s == "" {
		return false
	}
	number := func(r rune) bool { return r >= '0' && r <= '9' || r == '.' }
	for s != "" {
		i := strings.IndexFunc(s, func(r rune) bool { return !number(r) })
		if i <= 0 {
			return false // no number, or no unit after it
		}
		if _, err := strconv.ParseFloat(s[:i], 64); err != nil {
			return false
		}
		s = s[i:]
		j := strings.IndexFunc(s, number)
		if j < 0 {
			j = len(s)
		}
		if !slices.Contains([]string{"ns", "us", "µs", "μs", "ms", "s", "m", "h"}, s[:j]) {
			return false
		}
		s = s[j:]
	}
	return true
}

func (fs *flagSet) long(name string) *flagDef {
	for _, d := range fs.defs {
		if d.long == name {
			return d
		}
	}
	return nil
}

func (fs *flagSet) short(c byte) *flagDef {
	for _, d := range fs.defs {
		if d.short == c && c != 0 {
			return d
		}
	}
	return nil
}

// parse reads args; -h or --help anywhere among the options is errHelp.
func (fs *flagSet) parse(args []string) error {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			fs.dashAt = len(fs.args)
			fs.args = append(fs.args, args[i+1:]...)
			return nil
		case len(a) < 2 || a[0] != '-':
			if !fs.interspersed {
				fs.args = append(fs.args, args[i:]...)
				return nil
			}
			fs.args = append(fs.args, a)
		case a[1] == '-':
			name, value, hasValue := strings.Cut(a[2:], "=")
			d := fs.long(name)
			switch {
			case name == "help" && d == nil:
				return errHelp
			case d == nil:
				return usagef("unknown flag: --%s", name)
			case d.value == "" && !hasValue:
				value = "true"
			case !hasValue:
				if i+1 == len(args) {
					return usagef("flag needs an argument: --%s", name)
				}
				i++
				value = args[i]
			}
			if err := fs.set(d, "--"+name, value); err != nil {
				return err
			}
		default:
			for j := 1; j < len(a); j++ {
				d := fs.short(a[j])
				switch {
				case a[j] == 'h' && d == nil:
					return errHelp
				case d == nil:
					return usagef("unknown shorthand flag: %q in %s", a[j], a)
				case d.value == "":
					if err := fs.set(d, "-"+string(a[j]), "true"); err != nil {
						return err
					}
					continue
				}
				value := a[j+1:]
				if value == "" {
					if i+1 == len(args) {
						return usagef("flag needs an argument: -%c", a[j])
					}
					i++
					value = args[i]
				}
				if err := fs.set(d, "-"+string(a[j]), value); err != nil {
					return err
				}
				break
			}
		}
	}
	return nil
}

func (fs *flagSet) set(d *flagDef, as, value string) error {
	if err := d.set(value); err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) {
			err = ne.Err // the value is in the message already
		}
		return usagef("invalid argument %q for %s: %v", value, as, err)
	}
	fs.changed[d.long] = true
	return nil
}

// given lists the long names of the options given, in lexical order.
func (fs *flagSet) given() []string {
	var names []string
	for name := range fs.changed {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// printUsage writes usage, then the options of fs, aligned.
func (fs *flagSet) printUsage(w io.Writer) {
	fmt.Fprint(w, usage)
	defs := append(slices.Clone(fs.defs), &flagDef{short: 'h', long: "help", help: "print this help and exit"})
	col := 0
	heads := make([]string, len(defs))
	for i, d := range defs {
		h := "      --" + d.long
		if d.short != 0 {
			h = "  -" + string(d.short) + ", --" + d.long
		}
		if d.value != "" {
			h += " " + d.value
		}
		heads[i] = h
		col = max(col, len(h))
	}
	for i, d := range defs {
		fmt.Fprintf(w, "%-*s  %s\n", col, heads[i], d.help)
	}
}
