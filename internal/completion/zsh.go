package completion

import "strings"

// zsh writes c's script for zsh: an _arguments specification per option
// table, which parses the words as getopt does (-s: grouped short
// options; -S: "--" ends the options; -A: the first word that is not an
// option ends the command's own). It works as an autoloaded function (a
// file _NAME in fpath, as installed) and when sourced after compinit.
func zsh(c *Command) string {
	f := funcName(c.Name)
	fn := "_" + c.Name
	var b strings.Builder
	b.WriteString("#compdef " + c.Name + "\n")
	b.WriteString(header("#", "zsh", c))
	b.WriteString(strings.NewReplacer("@F@", f, "@QUERY@", QueryCommand).Replace(zshValues))

	b.WriteString("\n" + fn + "() {\n")
	b.WriteString("\tlocal " + f + "_prog=$words[1]\n")
	b.WriteString("\tlocal curcontext=$curcontext state state_descr line ret=1\n")
	b.WriteString("\ttypeset -A opt_args\n")
	flags := "-s -S -A '-*'"
	if len(c.Subcommands) > 0 {
		flags = "-C " + flags
	}
	b.WriteString("\t_arguments " + flags + " : \\\n")
	for _, o := range visible(c.Options) {
		b.WriteString("\t\t" + zshSpec(f, &o) + " \\\n")
	}
	switch {
	case len(c.Subcommands) > 0:
		b.WriteString("\t\t'1: :->first' \\\n\t\t'*:: :->rest' && ret=0\n")
		b.WriteString("\tcase $state in\n\tfirst)\n")
		subs := "\t\tlocal -a subs=(\n"
		for _, s := range c.Subcommands {
			subs += "\t\t\t" + quote(zshEscape(s.Name, ":")+":"+s.Help) + "\n"
		}
		subs += "\t\t)\n\t\t_describe -t commands " + quote(c.Name+" command") + " subs && ret=0\n"
		if c.Args == CommandLine {
			// After "--", the command to run.
			b.WriteString("\t\tif ((${words[(I)--]} && ${words[(I)--]} < CURRENT)); then\n")
			b.WriteString("\t\t\t_command_names -e && ret=0\n\t\telse\n")
			b.WriteString(indent(subs, "\t"))
			b.WriteString("\t\tfi\n")
		} else {
			b.WriteString(subs)
		}
		b.WriteString("\t\t;;\n\trest)\n")
		b.WriteString("\t\tcurcontext=${curcontext%:*:*}:" + c.Name + "-$words[1]:\n")
		b.WriteString("\t\tcase $words[1] in\n")
		for _, s := range c.Subcommands {
			b.WriteString("\t\t" + quote(s.Name) + ")\n")
			b.WriteString("\t\t\t_arguments -s -S : \\\n")
			for _, o := range visible(s.Options) {
				b.WriteString("\t\t\t\t" + zshSpec(f, &o) + " \\\n")
			}
			if a := zshArgs(f, s.Args, s.MaxArgs); a != "" {
				b.WriteString("\t\t\t\t" + a + " \\\n")
			}
			b.WriteString("\t\t\t\t&& ret=0\n\t\t\t;;\n")
		}
		if c.Args == CommandLine {
			b.WriteString("\t\t*) _normal && ret=0 ;;\n")
		}
		b.WriteString("\t\tesac\n\t\t;;\n\tesac\n")
	case c.Args == CommandLine:
		b.WriteString("\t\t'(-)1: :_command_names -e' \\\n\t\t'*:: :_normal' && ret=0\n")
	default:
		if a := zshArgs(f, c.Args, 0); a != "" {
			b.WriteString("\t\t" + a + " \\\n")
		}
		b.WriteString("\t\t&& ret=0\n")
	}
	b.WriteString("\treturn ret\n}\n\n")
	// Autoloaded, the file is the body of the function it defines: run
	// that. Sourced, register it.
	b.WriteString("if [[ $funcstack[1] == " + fn + " ]]; then\n\t" + fn + " \"$@\"\nelse\n\tcompdef " + fn + " " + c.Name + "\nfi\n")
	return b.String()
}

// zshValues asks the broker for values: the --socket given on the line,
// if any, through opt_args; for a list (0-3,5), after its last comma.
const zshValues = `
# @F@_values KIND: the broker's values of KIND, with what each is; none
# where no broker answers.
@F@_values() {
	local prog=@QUERY@ line
	local -a sock vals
	if [[ $@F@_prog == */* && -x ${@F@_prog:h}/@QUERY@ ]]; then
		prog=${@F@_prog:h}/@QUERY@
	fi
	[[ $prog == */* ]] || (($+commands[$prog])) || return 1
	[[ -n ${opt_args[--socket]} ]] && sock=(--socket ${(Q)opt_args[--socket]})
	for line in ${(f)"$($prog __complete $1 $sock 2>/dev/null)"}; do
		vals+=(${line%%$'\t'*}:${line#*$'\t'})
	done
	[[ $1 != pools ]] && compset -P '*,'
	_describe -t $1 ${1//-/ } vals
}
`

// zshSpec is o's _arguments specification.
func zshSpec(f string, o *Option) string {
	names := o.names()
	help := "[" + zshEscape(o.oneLine(), `\[]`) + "]"
	arg := ""
	if o.Value != "" {
		arg = ":" + zshEscape(o.Value, `\:`) + ":" + zshAction(f, o.Complete, o.Words)
	}
	prefix := ""
	if !o.Many {
		prefix = "(" + strings.Join(names, " ") + ")"
	} else {
		prefix = "*"
	}
	forms := make([]string, len(names))
	for i, n := range names {
		forms[i] = n
		if o.Value != "" && strings.HasPrefix(n, "--") {
			forms[i] += "="
		} else if o.Value != "" {
			forms[i] += "+"
		}
	}
	if len(forms) == 1 {
		return quote(prefix + forms[0] + help + arg)
	}
	return quote(prefix) + "{" + strings.Join(forms, ",") + "}" + quote(help+arg)
}

// zshAction completes a value of kind k, and words.
func zshAction(f string, k Kind, words []string) string {
	var a string
	switch k {
	case Files:
		a = "_files"
	case Dirs:
		a = "_files -/"
	case Users:
		a = "_users"
	case CommandLine:
		a = "_command_names -e"
	default:
		if q := k.Query(); q != "" {
			a = f + "_values " + q
		}
	}
	switch {
	case len(words) > 0 && a == "":
		return "(" + strings.Join(words, " ") + ")"
	case len(words) > 0:
		return "{compadd -- " + strings.Join(words, " ") + "; " + a + "}"
	case a == "":
		return " "
	case k.Query() != "":
		return "{" + a + "}"
	}
	return a
}

// zshArgs is the specification of the words that are not options.
func zshArgs(f string, k Kind, max int) string {
	if k == None {
		return ""
	}
	what := map[Kind]string{Files: "file", Dirs: "directory", Users: "user", Pools: "pool", Devices: "device", Tasks: "task id", LiveTasks: "task id"}[k]
	if max == 1 {
		return quote("1:" + what + ":" + zshAction(f, k, nil))
	}
	return quote("*:" + what + ":" + zshAction(f, k, nil))
}

// zshEscape puts a backslash before each of chars in s.
func zshEscape(s, chars string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(chars, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// indent puts prefix before every line of s.
func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}
