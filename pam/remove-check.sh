#!/bin/sh
# npurun-remove-check: may npurun's PAM module, or npurun itself, be removed
# without locking anyone out? One check for make uninstall and for the
# Debian packages' prerm (installed as $(LIBEXECDIR)/npurun/npurun-remove-check).
#
#   npurun-remove-check --prog=NAME --force=HOW [--root=DIR]
#       [--module=PATH [--bare]] [--own=FILE]... [--skip-managed]
#       [--npurun=PATH [--bare-npurun]] [--forced]
#
# It looks for what would fail once the files are gone:
#
#   --module=PATH  a PAM configuration that loads the module PATH (or, with
#                  --bare, its bare name, for a module in a system
#                  directory): PAM fails every session of that service
#                  without it ("Module is unknown"), root's included. Read in
#                  /etc/pam.d, /usr/lib/pam.d, /lib/pam.d and pam-auth-update's
#                  profiles in /usr/share/pam-configs, all under --root.
#                  Comments do not count, nor a line whose type starts with
#                  "-" (PAM skips its module when it is missing); --own=FILE
#                  (a package's own profile) does not count, nor, with
#                  --skip-managed, the lines in pam-auth-update's block of
#                  /etc/pam.d/common-* (the package's prerm takes its profile
#                  out with pam-auth-update before the module goes).
#   --npurun=PATH  an sshd configuration whose ForceCommand runs npurun PATH
#                  (or, with --bare-npurun, npurun by name): sshd_config and
#                  sshd_config.d/*.conf in /etc/ssh under --root. Without the
#                  program every login of those accounts fails (exit 127).
#
# Found: it names each file and line on standard error, with what to do
# (NAME: the program that refuses; HOW: how to go ahead all the same), and
# exits 1; with --forced it names them as a warning and exits 0. Nothing
# found: exit 0, silently. It reads, and never writes.
set -eu

prog=npurun-remove-check force= root= module= bare= npurun= barenpurun= own= managed= forced=
for a in "$@"; do
	case $a in
	--prog=*) prog=${a#*=} ;;
	--force=*) force=${a#*=} ;;
	--root=*) root=${a#*=} ;;
	--module=*) module=${a#*=} ;;
	--bare) bare=1 ;;
	--own=*) own="$own
${a#*=}" ;;
	--skip-managed) managed=1 ;;
	--npurun=*) npurun=${a#*=} ;;
	--bare-npurun) barenpurun=1 ;;
	--forced) forced=1 ;;
	*) echo "npurun-remove-check: unknown argument: $a" >&2; exit 2 ;;
	esac
done

# files DIR...: the regular files in each DIR under --root, one a line.
files() {
	for d in "$@"; do
		for f in "$root$d/"*; do
			[ -f "$f" ] && printf '%s\n' "$f"
		done
	done
	return 0
}

# pam_lines: FILE:LINE: TEXT of each PAM line that loads the module.
pam_lines() {
	files /etc/pam.d /usr/lib/pam.d /lib/pam.d /usr/share/pam-configs | while IFS= read -r f; do
		if printf '%s\n' "$own" | grep -qxF -- "$f"; then continue; fi
		case $f in */pam.d/common-*) common=1 ;; *) common= ;; esac
		# The module by its path: under /lib, also by /usr/lib's (merged /usr).
		alt=
		case $module in /lib/*) alt=/usr$module ;; esac
		awk -v abs="$module" -v alt="$alt" -v bare="${bare:+${module##*/}}" -v skip="${managed:+$common}" '
			skip != "" && /^# here are the per-package modules/ { inblock = 1 }
			skip != "" && /^# end of pam-auth-update config/ { inblock = 0; next }
			inblock { next }
			substr($1, 1, 1) == "#" || substr($1, 1, 1) == "-" { next }
			{ for (i = 2; i <= NF; i++) if ($i == abs || (alt != "" && $i == alt) || (bare != "" && $i == bare)) { print FILENAME ":" FNR ": " $0; next } }' "$f"
	done
}

# sshd_lines: FILE:LINE: TEXT of each sshd ForceCommand that runs npurun.
sshd_lines() {
	{ [ -f "$root/etc/ssh/sshd_config" ] && printf '%s\n' "$root/etc/ssh/sshd_config"; files /etc/ssh/sshd_config.d | grep '\.conf$'; } | while IFS= read -r f; do
		awk -v path="$npurun" -v bare="$barenpurun" '
			tolower($1) == "forcecommand" { for (i = 2; i <= NF; i++) if ($i == path || (bare != "" && $i == "npurun")) { print FILENAME ":" FNR ": " $0; next } }' "$f"
	done
}

# report WHAT LINES HINT
report() {
	if [ -n "$forced" ]; then
		printf '%s: warning: %s; going ahead (%s):\n' "$prog" "$1" "$force" >&2
		printf '%s\n' "$2" | sed 's|^|  |' >&2
	else
		printf '%s: %s:\n' "$prog" "$1" >&2
		printf '%s\n' "$2" | sed 's|^|  |' >&2
		printf '%s: hint: %s; %s goes ahead all the same\n' "$prog" "$3" "$force" >&2
	fi
}

found=
if [ -n "$module" ]; then
	lines=$(pam_lines)
	if [ -n "$lines" ]; then
		report "PAM loads ${module##*/} here; without it every session through these services fails (\"Module is unknown\"), root's included" "$lines" \
			"take those lines out first (pam-auth-update --remove for a profile's; see pam_npurun(8)), then try again"
		found=1
	fi
fi
if [ -n "$npurun" ]; then
	lines=$(sshd_lines)
	if [ -n "$lines" ]; then
		report "sshd runs $npurun for these accounts (ForceCommand); without it each of their logins fails (exit 127)" "$lines" \
			"take the ForceCommand out and reload sshd (see pam_npurun(8)), then try again"
		found=1
	fi
fi
if [ -n "$found" ] && [ -z "$forced" ]; then
	exit 1
fi
exit 0
