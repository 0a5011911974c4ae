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

// flagDef is one entry of a form's table of options (submitOptions, a
// command's options), and what sets it.
type flagDef struct {
	completion.Option
	set func(v string) error
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

// newFlags is the flag set of table: each of its options is then bound to
// what it sets (switchVar, stringVar ...), and parse refuses to run with
// one unbound.
func newFlags(name string, interspersed bool, table []completion.Option) *flagSet {
	fs := &flagSet{name: name, interspersed: interspersed, changed: map[string]bool{}, dashAt: -1}
	for _, o := range table {
		fs.defs = append(fs.defs, &flagDef{Option: o})
	}
	return fs
}

// bind has set set the option long of fs's table; value tells whether set
// reads a value, many whether it keeps every one given. An option that is
// not in the table is left alone (commandFlags binds every command's
// options in each); one that the table says takes a value, or may be
// given again, otherwise than set does is a mistake here: bind panics.
func (fs *flagSet) bind(long string, value, many bool, set func(v string) error) {
	d := fs.long(long)
	switch {
	case d == nil:
		return
	case d.set != nil:
		panic(fs.name + ": option --" + long + " bound twice")
	case (d.Value != "") != value || d.Many != many:
		panic(fs.name + ": option --" + long + " takes a value or may be repeated otherwise than its table says")
	}
	d.set = set
}

// switchVar binds the switch long (a flag without a value) to p.
func (fs *flagSet) switchVar(p *bool, long string) {
	fs.bind(long, false, false, func(v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return err
		}
		*p = b
		return nil
	})
}

// stringVar binds the option long, whose value is a string, to p.
func (fs *flagSet) stringVar(p *string, long string) {
	fs.bind(long, true, false, func(v string) error {
		*p = v
		return nil
	})
}

// listVar binds the option long, which may be given again, each value
// appended, to p; split, when set, cuts each value at commas first.
func (fs *flagSet) listVar(p *[]string, long string, split bool) {
	fs.bind(long, true, true, func(v string) error {
		if split {
			*p = append(*p, strings.Split(v, ",")...)
		} else {
			*p = append(*p, v)
		}
		return nil
	})
}

// countVar binds the option long, whose value is a decimal count of what,
// such as "device count" (-n 010 is ten, as a person means it, not
// eight), to p; an example of the option goes in the hint of a bad one.
func (fs *flagSet) countVar(p *int, long, what, example string) {
	fs.bind(long, true, false, func(v string) error {
		n, err := strconv.ParseInt(v, 10, strconv.IntSize)
		if err != nil {
			return &usageError{msg: fmt.Sprintf("bad %s %q for %s", what, v, fs.as), hint: example}
		}
		*p = int(n)
		return nil
	})
}

// durationVar binds the option long, whose value is a duration (6h, 90m,
// 1d), as quantity.ParseDuration reads it, of at most max, to p.
func (fs *flagSet) durationVar(p *time.Duration, long string, max time.Duration) {
	fs.bind(long, true, false, func(v string) error {
		d, err := quantity.ParseDuration(v)
		if de := (*quantity.DurationError)(nil); errors.As(err, &de) {
			return &usageError{msg: de.For(fs.as), hint: fs.as + " takes " + quantity.DurationHelp}
		}
		if d > max {
			return &usageError{msg: fmt.Sprintf("bad duration %q for %s: longer than %s, the most", v, fs.as, quantity.Duration(max))}
		}
		*p = d
		return nil
	})
}

// unbound is the first option of fs's table that nothing sets, or nil.
func (fs *flagSet) unbound() *flagDef {
	for _, d := range fs.defs {
		if d.set == nil {
			return d
		}
	}
	return nil
}

func (fs *flagSet) long(name string) *flagDef {
	for _, d := range fs.defs {
		if d.Long == name {
			return d
		}
	}
	return nil
}

func (fs *flagSet) short(c byte) *flagDef {
	for _, d := range fs.defs {
		if d.Short == c && c != 0 {
			return d
		}
	}
	return nil
}

// parse reads args; -h or --help anywhere among the options is errHelp.
func (fs *flagSet) parse(args []string) error {
	if d := fs.unbound(); d != nil {
		panic(fs.name + ": option --" + d.Long + " of the table is bound to nothing")
	}
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
			case d.Value == "" && !hasValue:
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
				case d.Value == "":
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
		fs.changed[d.Long] = true
		return nil
	case errors.As(err, &ue):
		return err
	case d.Value == "":
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

// options are fs's table as --help and the completion scripts read it,
// -h and --help last.
func (fs *flagSet) options() []completion.Option {
	var opts []completion.Option
	for _, d := range fs.defs {
		opts = append(opts, d.Option)
	}
	return append(opts, completion.HelpOption)
}
