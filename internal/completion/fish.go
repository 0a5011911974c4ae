package completion

import "strings"

// fish writes c's script for fish: a function that walks the tokens
// before the cursor as the command's parser does and says where the line
// stands (the command's own options, a subcommand's, an option's value,
// the command to run), and one `complete` line per option, subcommand and
// argument, each under the condition that the line stands there. Fish 3.1
// or later.
func fish(c *Command) string {
	f := "_" + funcName(c.Name) // __task_submit
	var b strings.Builder
	b.WriteString(header("#", "fish", c))

	b.WriteString("\n# " + f + "_takes_value CONTEXT OPTION: whether OPTION takes a value there.\n")
	b.WriteString("function " + f + "_takes_value\n\tswitch \"$argv[1]/$argv[2]\"\n")
	var pats []string
	for _, x := range c.contexts() {
		for _, o := range x.opts {
			if o.Value != "" {
				for _, n := range o.names() {
					pats = append(pats, fishQuote(x.name+"/"+n))
				}
			}
		}
	}
	if len(pats) > 0 {
		b.WriteString("\t\tcase " + strings.Join(pats, " ") + "\n\t\t\treturn 0\n")
	}
	b.WriteString("\tend\n\treturn 1\nend\n")

	b.WriteString("\n# " + f + "_command_at CONTEXT: whether the words that are not options there are\n# a command of their own.\n")
	b.WriteString("function " + f + "_command_at\n\tswitch \"$argv[1]\"\n")
	for _, x := range c.contexts() {
		if x.args == CommandLine {
			b.WriteString("\t\tcase " + fishQuote(x.name) + "\n\t\t\treturn 0\n")
		}
	}
	b.WriteString("\tend\n\treturn 1\nend\n")

	subs := []string{}
	for _, s := range c.Subcommands {
		subs = append(subs, fishQuote(s.Name))
	}
	b.WriteString(strings.NewReplacer(
		"@F@", f,
		"@QUERY@", QueryCommand,
		"@SUBS@", strings.Join(subs, " "),
	).Replace(fishEngine))

	b.WriteString("\ncomplete -c " + c.Name + " -e\ncomplete -c " + c.Name + " -f\n")
	for _, x := range c.contexts() {
		at := fishQuote(f + "_at " + fishQuote(x.name))
		for _, o := range visible(x.opts) {
			b.WriteString("complete -c " + c.Name + " -n " + at)
			if o.Short != 0 {
				b.WriteString(" -s " + string(o.Short))
			}
			if o.Long != "" {
				b.WriteString(" -l " + o.Long)
			}
			if o.Value != "" {
				b.WriteString(fishValue(f, o.Complete, o.Words))
			}
			b.WriteString(" -d " + fishQuote(o.oneLine()) + "\n")
		}
		if x.name == "" {
			for _, s := range c.Subcommands {
				b.WriteString("complete -c " + c.Name + " -n " + at + " -a " + fishQuote(s.Name) + " -d " + fishQuote(s.Help) + "\n")
			}
		}
		switch {
		case x.args == CommandLine:
			b.WriteString("complete -c " + c.Name + " -n " + fishQuote(f+"_at -cmd") + " -a " + fishQuote("("+f+"_command)") + "\n")
		case x.args != None:
			args := fishQuote(f + "_args " + fishQuote(x.name) + " " + itoa(x.max))
			v := " -F"
			if x.args != Files {
				v = strings.TrimPrefix(fishValue(f, x.args, nil), " -x")
			}
			b.WriteString("complete -c " + c.Name + " -n " + args + v + "\n")
		}
	}
	return b.String()
}

// fishValue is the flags of a complete line for a value of kind k, and
// words.
func fishValue(f string, k Kind, words []string) string {
	var a []string
	switch k {
	case Files:
		if len(words) == 0 {
			return " -r -F"
		}
		a = append(a, "(__fish_complete_path (commandline -ct))")
	case Dirs:
		a = append(a, "(__fish_complete_directories (commandline -ct))")
	case Users:
		a = append(a, "(__fish_complete_users)")
	default:
		if q := k.Query(); q != "" {
			a = append(a, "("+f+"_values "+q+")")
		}
	}
	a = append(a, words...)
	if len(a) == 0 {
		return " -x"
	}
	return " -x -a " + fishQuote(strings.Join(a, " "))
}

// fishQuote is s in single quotes for fish.
func fishQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// fishEngine walks the tokens (@F@_where), and the conditions and values
// of the complete lines use what it finds.
const fishEngine = `
# @F@_where: where the line stands, as the command's parser reads the
# tokens before the cursor: the context ("" for the command's own options,
# a subcommand, or -cmd where the token belongs to a command of its own),
# the count of words that are not options there ("-" while an option's
# value is completed; for -cmd, the index of the command's first token),
# and the --socket given.
function @F@_where
	set -l tokens (commandline -opc) (commandline -ct)
	set -l n (count $tokens)
	set -l ctx ''
	set -l nargs 0
	set -l dashes 0
	set -l socket ''
	set -l subs @SUBS@
	set -l i 2
	while test $i -lt $n
		set -l w $tokens[$i]
		if test $dashes = 0; and string match -qr -- '^-.' $w
			if test "$w" = --
				set dashes 1
			else if string match -q -- '--*=*' $w
				string match -q -- '--socket=*' $w; and set socket (string replace -- '--socket=' '' $w)
			else
				# An option whose value is the next token: a long one, or
				# the last of grouped short ones (-vp POOL).
				set -l opt $w
				if not string match -q -- '--*' $w
					set opt ''
					set -l chars (string split '' -- (string sub -s 2 -- $w))
					set -l j 0
					for c in $chars
						set j (math $j + 1)
						if @F@_takes_value "$ctx" -$c
							test $j -eq (count $chars); and set opt -$c
							break
						end
					end
				end
				if test -n "$opt"; and @F@_takes_value "$ctx" $opt
					set i (math $i + 1)
					if test $i -eq $n
						printf '%s\n' $ctx - $socket
						return
					end
					test "$opt" = --socket; and set socket $tokens[$i]
				end
			end
		else if test -z "$ctx" -a $dashes = 0 -a (count $subs) -gt 0
			set ctx $w
		else if @F@_command_at "$ctx"
			printf '%s\n' -cmd $i $socket
			return
		else
			set nargs (math $nargs + 1)
			# The command's own options end here.
			test -z "$ctx"; and set dashes 1
		end
		set i (math $i + 1)
	end
	# The token being completed: the command to run?
	if @F@_command_at "$ctx"; and test $dashes = 1 -o (count $subs) = 0
		if test $dashes = 1; or not string match -q -- '-*' $tokens[$n]
			printf '%s\n' -cmd $n $socket
			return
		end
	end
	printf '%s\n' $ctx $nargs $socket
end

# @F@_at CONTEXT: whether the line stands there.
function @F@_at
	set -l w (@F@_where)
	test "$w[1]" = "$argv[1]"
end

# @F@_args CONTEXT MAX: whether a word that is not an option is completed
# there, fewer than MAX (0: any number) before it.
function @F@_args
	set -l w (@F@_where)
	test "$w[1]" = "$argv[1]" -a "$w[2]" != -; or return 1
	test $argv[2] -eq 0 -o $w[2] -lt $argv[2]
end

# @F@_command: completes the command to run, and its arguments, as its
# own completions do.
function @F@_command
	set -l w (@F@_where)
	set -l tokens (commandline -opc) (commandline -ct)
	__fish_complete_subcommand --commandline $tokens[$w[2]..-1]
end

# @F@_values KIND: the broker's values of KIND, with what each is; none
# where no broker answers. For a list (0-3,5), after its last comma.
function @F@_values
	set -l prog @QUERY@
	set -l self (commandline -opc)[1]
	if string match -q -- '*/*' $self
		set -l dir (string replace -r -- '/[^/]*$' '' $self)
		test -x $dir/@QUERY@; and set prog $dir/@QUERY@
	end
	command -q $prog; or return 0
	set -l w (@F@_where)
	set -l sock
	test -n "$w[3]"; and set sock --socket $w[3]
	set -l head ''
	if test $argv[1] != pools
		set head (string replace -r -- '^--[^=]*=' '' (commandline -ct) | string match -r -- '^.*,')
	end
	$prog __complete $argv[1] $sock 2>/dev/null | string replace -r -- '^' "$head"
end
`
