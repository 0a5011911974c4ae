# zsh -f zsh-complete.zsh LINE SCRIPT...: in an interactive zsh on a
# pseudo-terminal (zsh/zpty), with compinit run and each SCRIPT sourced,
# types LINE and a tab, and prints what the completion system offered,
# one a line: every compadd of a completion function is caught, its
# matches taken (compadd -A) and printed between @@@ marks, not added.
zmodload zsh/zpty || exit 2
line=$1
shift
zpty z zsh -f -i
zpty -w z "PS1='' RPS1=''; unsetopt zle_bracketed_paste 2>/dev/null"
zpty -w z 'autoload -U compinit; compinit -u -D'
for f; do
	zpty -w z "source ${(q)f}"
done
zpty -w z 'compadd() {
	if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then
		builtin compadd "$@"
		return
	fi
	local -a __hits
	builtin compadd -A __hits "$@"
	local h
	for h in $__hits; do
		print -r -- "${:-@@}@$IPREFIX$h${:-@@}@"
	done
}'
zpty -w z 'finish() { print -r -- "${:-@@}@END${:-@@}@"; exit }; zle -N finish; bindkey "^X" finish'
zpty -n -w z "$line"$'\t\x18'
out=
while zpty -r z chunk; do
	out+=$chunk
	[[ $out == *@@@END@@@* ]] && break
done
for l in ${(f)out}; do
	[[ $l == *@@@*@@@* ]] || continue
	l=${l#*@@@}
	l=${l%@@@*}
	[[ $l == END ]] || print -r -- $l
done
