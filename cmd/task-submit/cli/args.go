package cli

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/npurun/npurun/internal/completion"
	"github.com/npurun/npurun/internal/quantity"
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
// switch), its help, and what sets it; and for the completion scripts,
// what completes its value and whether it may be given again.
type flagDef struct {
	short    byte
	long     string
	value    string
	help     string
	set      func(v string) error
	complete completion.Kind
	words    []string
	many     bool
	hidden   bool
}

// flagSet is one form's options, and what a parse found.
type flagSet struct {
	name         string // for messages: "task-submit", "task-submit list"
	defs         []*flagDef
	interspersed bool // options may follow other words

	changed map[string]bool // long names given
	args    []string        // the words that are not options
	dashAt  int             // len(args) when "--" came; -1 without one
	as      string          // the option being set, as it was written (-n, --time), for messages
}

func newFlags(name string, interspersed bool) *flagSet {
	return &flagSet{name: name, interspersed: interspersed, changed: map[string]bool{}, dashAt: -1}
}

// switchVar adds a switch (a flag without a value).
func (fs *flagSet) switchVar(p *bool, short byte, long, help string) *flagDef {
	return fs.add(&flagDef{short: short, long: long, help: help, set: func(v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return err
		}
		*p = b
		return nil
	}})
}

// stringVar adds an option whose value is a string.
func (fs *flagSet) stringVar(p *string, short byte, long, value, help string) *flagDef {
	return fs.add(&flagDef{short: short, long: long, value: value, help: help, set: func(v string) error {
		*p = v
		return nil
	}})
}

// listVar adds an option that may be given again, each value appended;
// split, when set, cuts each value at commas first.
func (fs *flagSet) listVar(p *[]string, short byte, long, value, help string, split bool) *flagDef {
	return fs.add(&flagDef{short: short, long: long, value: value, help: help, many: true, set: func(v string) error {
		if split {
			*p = append(*p, strings.Split(v, ",")...)
		} else {
			*p = append(*p, v)
		}
		return nil
	}})
}

// countVar adds an option whose value is a decimal count of what, such
// as "device count" (-n 010 is ten, as a person means it, not eight); an
// example of the option goes in the hint of a bad one.
func (fs *flagSet) countVar(p *int, short byte, long, value, help, what, example string) *flagDef {
	return fs.add(&flagDef{short: short, long: long, value: value, help: help, set: func(v string) error {
		n, err := strconv.ParseInt(v, 10, strconv.IntSize)
		if err != nil {
			return &usageError{msg: fmt.Sprintf("bad %s %q for %s", what, v, fs.as), hint: example}
		}
		*p = int(n)
		return nil
	}})
}

// durationVar adds an option whose value is a duration (6h, 90m, 1d), as
// quantity.ParseDuration reads it, of at most max.
func (fs *flagSet) durationVar(p *time.Duration, short byte, long, value, help string, max time.Duration) *flagDef {
	return fs.add(&flagDef{short: short, long: long, value: value, help: help, set: func(v string) error {
		d, err := quantity.ParseDuration(v)
		if de := (*quantity.DurationError)(nil); errors.As(err, &de) {
			return &usageError{msg: de.For(fs.as), hint: fs.as + " takes " + quantity.DurationHelp}
		}
		if d > max {
			return &usageError{msg: fmt.Sprintf("bad duration %q for %s: longer than %s, the most", v, fs.as, quantity.Duration(max))}
		}
		*p = d
		return nil
	}})
}

// add adds d to fs and returns it.
func (fs *flagSet) add(d *flagDef) *flagDef {
	fs.defs = append(fs.defs, d)
	return d
}

// completes sets what completes d's value in the completion scripts, and
// words offered besides; it returns d.
func (d *flagDef) completes(k completion.Kind, words ...string) *flagDef {
	d.complete, d.words = k, words
	return d
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
				return fs.unknown("--" + name)
			case d.value == "" && !hasValue:
				value = "true"
			case !hasValue:
				if i+1 == len(args) {
					return usagef("option --%s needs a value", name)
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
					return fs.unknown("-" + a[j:j+1])
				case d.value == "":
					if err := fs.set(d, "-"+string(a[j]), "true"); err != nil {
						return err
					}
					continue
				}
				value := a[j+1:]
				if value == "" {
					if i+1 == len(args) {
						return usagef("option -%c needs a value", a[j])
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

// set gives d its value; as is how the option was written. Its messages
// read as npurun's (shim/args.go) do.
func (fs *flagSet) set(d *flagDef, as, value string) error {
	fs.as = as
	err := d.set(value)
	var ue *usageError
	switch {
	case err == nil:
		fs.changed[d.long] = true
		return nil
	case errors.As(err, &ue):
		return err
	case d.value == "":
		return usagef("option %s takes no value (or =true, =false), not %q", as, value)
	}
	return usagef("bad value %q for %s: %v", value, as, err)
}

// unknown is the error of an option fs does not know.
func (fs *flagSet) unknown(as string) error {
	return &usageError{msg: "unknown option " + as, hint: fs.name + " --help lists the options"}
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
	fmt.Fprint(w, completion.Help(fs.options(), 2))
}

// options are fs's options as --help and the completion scripts read
// them, -h and --help last.
func (fs *flagSet) options() []completion.Option {
	var opts []completion.Option
	for _, d := range fs.defs {
		opts = append(opts, completion.Option{Short: d.short, Long: d.long, Value: d.value, Help: d.help,
			Many: d.many, Hidden: d.hidden, Complete: d.complete, Words: d.words})
	}
	return append(opts, completion.Option{Short: 'h', Long: "help", Help: "print this help and exit"})
}
