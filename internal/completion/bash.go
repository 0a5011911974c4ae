package completion

import "strings"

// bash writes c's script for bash: tables made of c (the options of each
// context, which take a value and what completes it, what completes the
// other words), then the engine, the same for every command, that walks
// the words before the cursor with them as the command's parser does.
// It needs bash 4; it uses bash-completion's _command_offset for the
// command npurun runs where bash-completion is loaded, and stands alone
// otherwise.
func bash(c *Command) string {
	f := funcName(c.Name)
	var b strings.Builder
	b.WriteString(header("#", "bash", c))
	b.WriteString("\n# " + f + "_opts CONTEXT: REPLY is the options of the command (\"\") or a subcommand.\n")
	b.WriteString(f + "_opts() {\n\tcase $1 in\n")
	for _, x := range c.contexts() {
		var names []string
		for _, o := range visible(x.opts) {
			names = append(names, o.names()...)
		}
		b.WriteString("\t" + quote(x.name) + ") REPLY=" + quote(strings.Join(names, " ")) + " ;;\n")
	}
	b.WriteString("\t*) REPLY= ;;\n\tesac\n}\n")

	b.WriteString("\n# " + f + "_value CONTEXT OPTION: fails for an option that takes no value; else sets\n" +
		"# kind and words, what completes the value.\n")
	b.WriteString(f + "_value() {\n\tcase $1/$2 in\n")
	for _, x := range c.contexts() {
		for _, o := range x.opts {
			if o.Value == "" {
				continue
			}
			var pats []string
			for _, n := range o.names() {
				pats = append(pats, quote(x.name+"/"+n))
			}
			b.WriteString("\t" + strings.Join(pats, "|") + ") kind=" + bashKind(o.Complete) + " words=" + quote(strings.Join(o.Words, " ")) + " ;;\n")
		}
	}
	b.WriteString("\t*) return 1 ;;\n\tesac\n}\n")

	b.WriteString("\n# " + f + "_args CONTEXT: sets kind, what completes the words that are not options,\n" +
		"# and max, how many it takes (0: any number).\n")
	b.WriteString(f + "_args() {\n\twords=\n\tcase $1 in\n")
	for _, x := range c.contexts() {
		b.WriteString("\t" + quote(x.name) + ") kind=" + bashKind(x.args) + " max=" + itoa(x.max) + " ;;\n")
	}
	b.WriteString("\t*) kind=none max=0 ;;\n\tesac\n}\n")

	b.WriteString(strings.NewReplacer(
		"@F@", f,
		"@NAME@", c.Name,
		"@QUERY@", QueryCommand,
		"@SUBS@", quote(c.subcommandNames()),
	).Replace(bashEngine))
	return b.String()
}

func bashKind(k Kind) string {
	switch k {
	case Files:
		return "files"
	case Dirs:
		return "dirs"
	case Users:
		return "users"
	case CommandLine:
		return "command"
	}
	if q := k.Query(); q != "" {
		return q
	}
	return "none"
}

// itoa is strconv.Itoa for the small counts of a table.
func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// bashEngine is the completion function. It reads COMP_WORDS up to the
// cursor the way the command's parser reads its arguments: options (short
// ones grouped, values attached or in the next word, "--opt=value" put
// back together where bash split it at "="), "--", a subcommand, the
// command to run; then offers what may come at the cursor.
const bashEngine = `
# @F@_query KIND: the broker's values of KIND, one a line (VALUE, a tab, what
# it is); nothing where no broker answers. The --socket given on the line,
# if any, is asked.
@F@_query() {
	local prog=@QUERY@
	if [[ ${COMP_WORDS[0]} == */* && -x ${COMP_WORDS[0]%/*}/@QUERY@ ]]; then
		prog=${COMP_WORDS[0]%/*}/@QUERY@
	fi
	type -P "$prog" >/dev/null || return 0
	"$prog" __complete "$1" ${socket:+--socket "$socket"} 2>/dev/null
}

# @F@_complete CUR PRE: COMPREPLY is the values of kind and words that
# start with CUR, each written after PRE.
@F@_complete() {
	local cur=$1 pre=$2 head= line
	case $kind in
	files)
		compopt -o filenames 2>/dev/null
		mapfile -t COMPREPLY < <(compgen -f -- "$cur")
		;;
	dirs)
		compopt -o filenames 2>/dev/null
		mapfile -t COMPREPLY < <(compgen -d -- "$cur")
		;;
	users) mapfile -t COMPREPLY < <(compgen -u -- "$cur") ;;
	pools | devices | tasks | live-tasks)
		# A list: the values go after its last comma.
		[[ $kind != pools ]] && head=${cur%"${cur##*,}"}
		while IFS= read -r line; do
			line=$head${line%%$'\t'*}
			[[ -n ${line#"$head"} && $line == "$cur"* ]] && COMPREPLY+=("$line")
		done < <(@F@_query "$kind")
		;;
	esac
	if [[ -n $words ]]; then
		mapfile -t -O ${#COMPREPLY[@]} COMPREPLY < <(compgen -W "$words" -- "$cur")
	fi
	if [[ -n $pre ]]; then
		COMPREPLY=("${COMPREPLY[@]/#/$pre}")
	fi
}

# @F@_command INDEX: COMP_WORDS from INDEX on are a command of their own.
@F@_command() {
	if declare -F _command_offset >/dev/null; then
		_command_offset "$1"
	elif (($1 == COMP_CWORD)); then
		mapfile -t COMPREPLY < <(compgen -c -- "${COMP_WORDS[COMP_CWORD]}")
	else
		compopt -o default 2>/dev/null # its arguments: file names
		COMPREPLY=()
	fi
}

@F@() {
	local -a ws=() at=()
	local i j w opt val cur ctx= kind= words= max=0 nargs=0 dashes= socket= joined= valfor=
	local subs=@SUBS@
	COMPREPLY=()
	# The words up to the cursor, "--opt" "=" "value" joined; at: where
	# each begins in COMP_WORDS.
	for ((i = 0; i <= COMP_CWORD; i++)); do
		w=${COMP_WORDS[i]}
		j=$((${#ws[@]} - 1))
		if [[ $w == = ]] && ((j > 0)) && [[ ${ws[j]} == --?* && ${ws[j]} != *=* ]]; then
			ws[j]+==
			((i == COMP_CWORD)) && joined=1
			if ((i < COMP_CWORD)); then
				((i++))
				ws[j]+=${COMP_WORDS[i]}
				((i == COMP_CWORD)) && joined=1
			fi
			continue
		fi
		ws+=("$w")
		at+=("$i")
	done
	local cw=$((${#ws[@]} - 1))
	cur=${ws[cw]}
	for ((i = 1; i < cw; i++)); do
		w=${ws[i]}
		if [[ -z $dashes && $w == -?* ]]; then
			if [[ $w == -- ]]; then
				dashes=1
				continue
			fi
			# An option: its value attached, or the next word.
			opt= val=
			if [[ $w == --*=* ]]; then
				val=${w#*=}
				[[ ${w%%=*} == --socket ]] && socket=$val
			elif [[ $w == --* ]]; then
				@F@_value "$ctx" "$w" && opt=$w
			else
				for ((j = 1; j < ${#w}; j++)); do
					if @F@_value "$ctx" "-${w:j:1}"; then
						((j + 1 == ${#w})) && opt=-${w:j:1}
						break
					fi
				done
			fi
			if [[ -n $opt ]]; then
				if ((i + 1 == cw)); then
					valfor=$opt
					break
				fi
				((i++))
				[[ $opt == --socket ]] && socket=${ws[i]}
			fi
			continue
		fi
		# A word that is not an option: the subcommand, the command to
		# run, or an argument.
		if [[ -z $ctx && -z $dashes && -n $subs ]]; then
			ctx=$w
			continue
		fi
		@F@_args "$ctx"
		if [[ $kind == command ]]; then
			@F@_command "${at[i]}"
			return
		fi
		((nargs++))
		[[ -z $ctx ]] && dashes=1 # the command's own options end here
	done
	if [[ -n $valfor ]]; then
		@F@_value "$ctx" "$valfor"
		@F@_complete "$cur" ""
		return
	fi
	if [[ -z $dashes && $cur == -* ]]; then
		if [[ $cur == --*=* ]]; then
			# --opt=value: where bash split at "=", the value alone is
			# replaced.
			@F@_value "$ctx" "${cur%%=*}" || return 0
			if [[ -n $joined ]]; then
				@F@_complete "${cur#*=}" ""
			else
				@F@_complete "${cur#*=}" "${cur%%=*}="
			fi
			return
		fi
		if [[ $cur != --* ]]; then
			# -pVALUE, -vpVALUE
			for ((j = 1; j < ${#cur}; j++)); do
				if @F@_value "$ctx" "-${cur:j:1}"; then
					if ((j + 1 < ${#cur})); then
						@F@_complete "${cur:j+1}" "${cur:0:j+1}"
						return
					fi
					break
				fi
			done
		fi
		@F@_opts "$ctx"
		mapfile -t COMPREPLY < <(compgen -W "$REPLY" -- "$cur")
		return
	fi
	if [[ -z $ctx && -z $dashes && -n $subs ]]; then
		mapfile -t COMPREPLY < <(compgen -W "$subs" -- "$cur")
		return
	fi
	@F@_args "$ctx"
	if [[ $kind == command ]]; then
		@F@_command "${at[cw]}"
	elif ((max == 0 || nargs < max)); then
		@F@_complete "$cur" ""
	fi
}

complete -F @F@ @NAME@
`
