# npurun — build, test and install.
#
# Variables (override on the command line: make install PREFIX=/usr):
#   PREFIX      install prefix                          (/usr/local)
#   DESTDIR     staging root for packagers: prepended to every path
#               written, never to the paths written into files  (empty)
#   BINDIR      user commands: npurun, task-submit      ($(PREFIX)/bin)
#   SBINDIR     the daemons: npubroker, npuboard        ($(PREFIX)/sbin)
#               The path is built into npurun, whose status and usage
#               commands run npubroker's for users without sbin in PATH
#               (one beside npurun's own executable first: a build directory)
#   LIBEXECDIR  programs run by the daemon, not people: npurun/npurun-supervise,
#               each task's supervisor ($(PREFIX)/libexec). The path is built
#               into npubroker, which runs a npurun-supervise found beside its
#               own executable first (a build directory), else this one; and
#               npurun/npurun-runtime, the OCI runtime a container engine
#               runs (npurun-runtime(8): Docker's daemon.json names it), with
#               npurun/npurun-runtime-create, which it runs for a create;
#               npurun/npurun-remove-check, the check that make uninstall
#               and the Debian packages' removal make (below)
#   MANDIR      man pages                               ($(PREFIX)/share/man)
#   BASHCOMPDIR bash completions: npurun, task-submit, npubroker, where
#               bash-completion loads them ($(PREFIX)/share/bash-completion/completions)
#   ZSHCOMPDIR  zsh completions: _npurun, _task-submit, _npubroker
#                                 (/usr/share/zsh/vendor-completions with
#                                  PREFIX=/usr; else $(PREFIX)/share/zsh/site-functions,
#                                  which zsh's fpath has for /usr/local)
#   FISHCOMPDIR fish completions: npurun.fish, task-submit.fish, npubroker.fish
#               ($(PREFIX)/share/fish/vendor_completions.d; fish reads
#               /usr/local's where XDG_DATA_DIRS names /usr/local/share)
#               The scripts are written by the built programs (npurun
#               --completion bash, ...) from the tables that parse their
#               options, into $(BUILDDIR)/completion
#   SYSCONFDIR  configuration: npurun/npurun.conf       (/etc; $(PREFIX)/etc *)
#   SYSTEMDDIR  systemd units                           (/lib/systemd/system;
#                                                        $(PREFIX)/lib/systemd/system *)
#   PAMDIR      PAM modules: pam_npurun.so              (/lib/security;
#                                                        $(PREFIX)/lib/security *)
#   SPANKDIR    Slurm's SPANK plugin spank_npurun.so, named by path in
#               Slurm's plugstack.conf                   ($(PREFIX)/lib/npurun)
#   SPANK       no: leave the SPANK plugin out of build and install even
#               where Slurm's headers are (the Debian packages build it,
#               into npurun, and Build-Depend on libslurm-dev) (empty)
#   BUILDDIR    where the binaries are built            (bin)
#   VERSION     version stamped into the binaries       (git describe)
#   GO          the Go toolchain                        (go)
#   CC, CFLAGS  the C compiler for pam_npurun.so, spank_npurun.so and
#               npurun-runtime, and flags added to their own
#               (-Wall -Wextra -Werror)                 (cc, -O2)
#   CPPFLAGS, LDFLAGS  preprocessor and linker flags for them (empty)
#   BROKER_GOFLAGS, BROKER_LDFLAGS  go build and Go linker flags added for
#               npubroker and npurun-runtime-create (both cgo, for NSS): make deb
#               builds them as PIEs with the distribution's hardening flags
#               (-buildmode=pie, -linkmode=external) (empty)
#   FUZZ_CC     the compiler of make fuzz-pam and fuzz-spank, with libFuzzer (clang)
#   FUZZTIME    seconds make fuzz-pam (fuzz-spank) runs the fuzzer (300)
#   DEBDIR      where make deb leaves the Debian packages   ($(BUILDDIR)/deb)
#   DEB_VERSION their version: debian/changelog's, plus +gitDATE.COMMIT in
#               a git checkout, so that a later commit's packages upgrade
#   VENDORDIR   the Go modules make deb builds from, vendored once (go mod
#               vendor, which needs the network or Go's module cache); the
#               package build itself is offline  ($(BUILDDIR)/vendor)
#   FORCE       make uninstall FORCE=1: remove pam_npurun.so even while
#               a PAM configuration loads it (below)          (empty)
#
# * With the usual prefixes, /usr/local and /usr, the configuration goes to
#   /etc and the units where systemd finds them: a working install. Any
#   other PREFIX keeps everything under it (make install PREFIX=/tmp/x
#   writes nothing outside /tmp/x), unless a variable is set explicitly.
#   The unit files name $(SBINDIR) and $(SYSCONFDIR) as installed.
#
# make uninstall removes a file only if it is the one this tree, with the
# same variables, would install (compared byte for byte), so it never
# removes another prefix's or another version's files; it names those it
# leaves. The configuration file is never removed: it is the administrator's.
# It refuses, naming the files and lines, while a PAM configuration under
# $(DESTDIR) (/etc/pam.d, /usr/lib/pam.d, pam-auth-update's profiles in
# /usr/share/pam-configs) loads the module it would remove: PAM would fail
# every session of that service without it ("Module is unknown"), root's
# included; and while an sshd ForceCommand (/etc/ssh/sshd_config and
# sshd_config.d) runs the npurun it would remove: those accounts' logins
# would fail. Take the lines out first (pam_npurun(8)), or FORCE=1. The
# Debian packages' removal makes the same check (pam/remove-check.sh).
#
# make demo and make test need Go, make, a C compiler and util-linux; not
# the PAM headers: the demo does not use the module, and the tests that
# build it skip without them (except in CI, CI=true, where they must run).

PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
SBINDIR    ?= $(PREFIX)/sbin
LIBEXECDIR ?= $(PREFIX)/libexec
MANDIR     ?= $(PREFIX)/share/man
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ifeq ($(PREFIX),/usr)
ZSHCOMPDIR ?= $(PREFIX)/share/zsh/vendor-completions
else
ZSHCOMPDIR ?= $(PREFIX)/share/zsh/site-functions
endif
FISHCOMPDIR ?= $(PREFIX)/share/fish/vendor_completions.d
ifneq ($(filter /usr/local /usr,$(PREFIX)),)
SYSCONFDIR ?= /etc
SYSTEMDDIR ?= /lib/systemd/system
PAMDIR     ?= /lib/security
else
SYSCONFDIR ?= $(PREFIX)/etc
SYSTEMDDIR ?= $(PREFIX)/lib/systemd/system
PAMDIR     ?= $(PREFIX)/lib/security
endif
SPANKDIR   ?= $(PREFIX)/lib/npurun
BUILDDIR   ?= bin
GO         ?= go
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

CC         ?= cc
CFLAGS     ?= -O2

GOFLAGS_BUILD = -trimpath -ldflags "-s -w -X main.version=$(VERSION)"
SUPERVISOR = $(LIBEXECDIR)/npurun/npurun-supervise
RUNTIME    = $(LIBEXECDIR)/npurun/npurun-runtime
RUNTIME_CREATE = $(LIBEXECDIR)/npurun/npurun-runtime-create
BINARIES = $(BUILDDIR)/npubroker $(BUILDDIR)/npuboard $(BUILDDIR)/npurun $(BUILDDIR)/task-submit $(BUILDDIR)/npurun-supervise $(BUILDDIR)/npurun-slurm $(BUILDDIR)/npurun-runtime $(BUILDDIR)/npurun-runtime-create $(BUILDDIR)/pam_npurun.so
SLURM_SCRIPT = $(LIBEXECDIR)/npurun/npurun-slurm
SOURCES = $(shell find . -name '*.go' -not -path './.git/*') go.mod go.sum
MAN1 = $(wildcard man/*.1)
MAN5 = $(wildcard man/*.5)
MAN8 = $(wildcard man/*.8)

.PHONY: all build test race demo bench bench-slurm man install uninstall clean units completions fuzz-pam fuzz-spank deb deb-vendor deb-test spank

all: build

build: $(BINARIES) spank

# npurun is static and lean: it sits in front of every job. npubroker uses
# cgo so that user and group lookups go through NSS (LDAP, sssd): without
# a C compiler Go would quietly build it without, and accounts known only
# to LDAP would be unknown to the broker.
$(BUILDDIR)/npurun: $(SOURCES)
	@mkdir -p $(BUILDDIR)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION) -X github.com/npurun/npurun/shim.InstalledBroker=$(SBINDIR)/npubroker -X github.com/npurun/npurun/shim.InstalledTaskSubmit=$(BINDIR)/task-submit" -o $@ ./cmd/npurun

$(BUILDDIR)/task-submit: $(SOURCES)
	@mkdir -p $(BUILDDIR)
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/task-submit

# The supervisor of each task, run by npubroker as the submitter: static
# and small too, as its start is part of a task's (it looks nothing up:
# the broker resolved the account). It has no version to stamp: the
# linker would ignore -X main.version there.
$(BUILDDIR)/npurun-supervise: $(SOURCES)
	@mkdir -p $(BUILDDIR)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o $@ ./cmd/npurun-supervise

# Slurm's Prolog and Epilog (slurm.conf Prolog=, Epilog=), run twice for
# every Slurm job with devices: static and lean, like npurun.
$(BUILDDIR)/npurun-slurm: $(SOURCES)
	@mkdir -p $(BUILDDIR)
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/npurun-slurm

need_cgo = if [ "$$($(GO) env CGO_ENABLED)" != 1 ]; then \
		echo "$(1) needs cgo, for user and group lookups through NSS (LDAP, sssd), and cgo is off:" >&2; \
		echo "  install a C compiler (gcc, or the one \$$CC names: $$($(GO) env CC)) and do not set CGO_ENABLED=0" >&2; \
		exit 1; \
	fi

$(BUILDDIR)/npubroker: $(SOURCES)
	@mkdir -p $(BUILDDIR)
	@$(call need_cgo,npubroker)
	CGO_ENABLED=1 $(GO) build $(BROKER_GOFLAGS) -trimpath -ldflags "-s -w $(BROKER_LDFLAGS) -X main.version=$(VERSION) -X github.com/npurun/npurun/broker/tasks/local.InstalledSupervisor=$(SUPERVISOR)" -o $@ ./cmd/npubroker

# npuboard, the web page of the boxes (npuboard(8)): a client of the
# broker like npurun, static; it looks up only --user, in /etc/passwd.
# It has no version to stamp.
$(BUILDDIR)/npuboard: $(SOURCES) $(wildcard board/templates/* board/static/*)
	@mkdir -p $(BUILDDIR)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o $@ ./cmd/npuboard

# The OCI runtime that hands a lease into a container: a small C program
# that an engine runs for every step of a container (create, start, state,
# kill, delete), which passes all but create to runc at once (a Go
# program's start there cost some 4 ms a step), and the create, in Go, with
# cgo too, as it names a container's owner by its uid.
RUNTIME_CFLAGS = -std=gnu11 -Wall -Wextra -Werror
$(BUILDDIR)/npurun-runtime: container/front/npurun-runtime.c
	@mkdir -p $(BUILDDIR)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(RUNTIME_CFLAGS) -o $@ $< $(LDFLAGS)

$(BUILDDIR)/npurun-runtime-create: $(SOURCES)
	@mkdir -p $(BUILDDIR)
	@$(call need_cgo,npurun-runtime-create)
	CGO_ENABLED=1 $(GO) build $(BROKER_GOFLAGS) -trimpath -ldflags "-s -w $(BROKER_LDFLAGS)" -o $@ ./cmd/npurun-runtime-create

# The PAM module is C on purpose (a Go runtime loaded into sshd can hang:
# see DESIGN.md), a thin client of the broker, built with warnings as
# errors against libpam (Debian: libpam0g-dev). Its wire code, shared with
# the SPANK plugin, is c/npurun_wire.c, #included: one translation unit.
PAM_CFLAGS = -std=gnu11 -Wall -Wextra -Werror -fPIC -shared
pam_headers = echo '\#include <security/pam_modules.h>' | $(CC) -E - >/dev/null 2>&1
$(BUILDDIR)/pam_npurun.so: pam/module/pam_npurun.c c/npurun_wire.c
	@mkdir -p $(BUILDDIR)
	@if ! $(pam_headers); then \
		echo "pam_npurun.so needs the PAM headers (security/pam_modules.h): install libpam0g-dev (Debian, Ubuntu) or pam-devel" >&2; \
		exit 1; \
	fi
	$(CC) $(CPPFLAGS) $(CFLAGS) $(PAM_CFLAGS) -o $@ $< $(LDFLAGS) -lpam

# The SPANK plugin is C for the PAM module's reason (it is loaded into
# slurmstepd), built with warnings as errors against Slurm's spank.h
# (Debian: libslurm-dev). Where the header is missing, make builds
# everything else and says so: only a Slurm node needs the plugin.
SPANK_CFLAGS = -std=gnu11 -Wall -Wextra -Werror -fPIC -shared
spank_headers = echo '\#include <slurm/spank.h>' | $(CC) -E - >/dev/null 2>&1
spank:
	@if [ "$(SPANK)" = no ]; then :; \
	elif $(spank_headers); then $(MAKE) --no-print-directory $(BUILDDIR)/spank_npurun.so; \
	else echo "spank_npurun.so (Slurm's SPANK plugin) not built: no Slurm headers (slurm/spank.h); install libslurm-dev (Debian, Ubuntu) or slurm-devel to build it" >&2; fi

$(BUILDDIR)/spank_npurun.so: slurm/spank/spank_npurun.c c/npurun_wire.c
	@mkdir -p $(BUILDDIR)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(SPANK_CFLAGS) -o $@ $< $(LDFLAGS)

# Fuzz pam_npurun.c's reply reader, receive path and request builder with
# libFuzzer under ASan and UBSan (Debian: clang, libclang-rt-14-dev); the
# harness is pam/module/fuzz/fuzz_pam_npurun.c, its seeds
# pam/module/fuzz/corpus. Not part of make test. What it finds goes to
# $(BUILDDIR)/fuzz-corpus, a crash to ./crash-*.
FUZZ_CC   ?= clang
FUZZTIME  ?= 300
fuzz-pam: pam/module/pam_npurun.c c/npurun_wire.c pam/module/fuzz/fuzz_pam_npurun.c
	@mkdir -p $(BUILDDIR)/fuzz-corpus
	$(FUZZ_CC) -g -O1 -Wall -Wextra -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
		-o $(BUILDDIR)/fuzz_pam_npurun pam/module/fuzz/fuzz_pam_npurun.c
	$(BUILDDIR)/fuzz_pam_npurun -max_total_time=$(FUZZTIME) -max_len=70000 -print_final_stats=1 \
		$(BUILDDIR)/fuzz-corpus pam/module/fuzz/corpus

# Fuzz spank_npurun.c's reply reader and a task's whole path (answer read,
# descriptors placed, variables set) likewise; the harness is
# slurm/spank/fuzz/fuzz_spank_npurun.c (built with -DSTANDALONE by gcc, it
# runs its seeds and their mutations without libFuzzer), its seeds
# slurm/spank/fuzz/corpus. Not part of make test.
fuzz-spank: slurm/spank/spank_npurun.c c/npurun_wire.c slurm/spank/fuzz/fuzz_spank_npurun.c
	@mkdir -p $(BUILDDIR)/fuzz-spank-corpus
	$(FUZZ_CC) -g -O1 -Wall -Wextra -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
		-o $(BUILDDIR)/fuzz_spank_npurun slurm/spank/fuzz/fuzz_spank_npurun.c
	$(BUILDDIR)/fuzz_spank_npurun -max_total_time=$(FUZZTIME) -max_len=70000 -print_final_stats=1 \
		$(BUILDDIR)/fuzz-spank-corpus slurm/spank/fuzz/corpus

# The units as installed, with this install's paths in them, and a first
# line that names the install: units of two installs that share
# SYSTEMDDIR (PREFIX=/usr/local and /usr) differ, so that uninstalling one
# leaves the other's.
UNIT_HEADER = \# Installed by npurun's make install: SBINDIR=$(SBINDIR) SYSCONFDIR=$(SYSCONFDIR)

units: $(BUILDDIR)/npubroker.service $(BUILDDIR)/npubroker.socket $(BUILDDIR)/npuboard.service

$(BUILDDIR)/npubroker.service $(BUILDDIR)/npubroker.socket: $(BUILDDIR)/%: broker/dist/% FORCE
	@mkdir -p $(BUILDDIR)
	@{ echo "$(UNIT_HEADER)"; sed -e 's|@SBINDIR@|$(SBINDIR)|g' -e 's|/etc/npurun/npurun.conf|$(SYSCONFDIR)/npurun/npurun.conf|g' $<; } > $@.tmp && mv $@.tmp $@

$(BUILDDIR)/npuboard.service: board/dist/npuboard.service FORCE
	@mkdir -p $(BUILDDIR)
	@{ echo "$(UNIT_HEADER)"; sed -e 's|@SBINDIR@|$(SBINDIR)|g' -e 's|/etc/npurun/npurun.conf|$(SYSCONFDIR)/npurun/npurun.conf|g' $<; } > $@.tmp && mv $@.tmp $@

FORCE:

# Shell completion scripts, written by each program from the tables that
# parse its options (internal/completion).
COMPLETION_PROGS = npurun task-submit npubroker
COMPLETIONS = $(foreach p,$(COMPLETION_PROGS),$(BUILDDIR)/completion/bash/$(p) $(BUILDDIR)/completion/zsh/_$(p) $(BUILDDIR)/completion/fish/$(p).fish)

completions: $(COMPLETIONS)

$(BUILDDIR)/completion/bash/%: $(BUILDDIR)/%
	@mkdir -p $(@D)
	$< --completion bash > $@.tmp && mv $@.tmp $@

$(BUILDDIR)/completion/zsh/_%: $(BUILDDIR)/%
	@mkdir -p $(@D)
	$< --completion zsh > $@.tmp && mv $@.tmp $@

$(BUILDDIR)/completion/fish/%.fish: $(BUILDDIR)/%
	@mkdir -p $(@D)
	$< --completion fish > $@.tmp && mv $@.tmp $@

# npurun --completion has the task-submit beside it write npurun's script
# (the script writers stay out of npurun, which starts in front of every job).
$(BUILDDIR)/completion/bash/npurun $(BUILDDIR)/completion/zsh/_npurun $(BUILDDIR)/completion/fish/npurun.fish: $(BUILDDIR)/task-submit

# The whole suite: unit tests under the race detector, then the end-to-end
# tests of the built binaries (tests/..., one package at a time: they
# share the machine's users, cgroups and daemons). As root with CI=true, tests that need root
# (other users, the PAM stack) must run: a skip is a failure there.
# The output is each package's verdict ("ok", "FAIL"), every skipped test
# with its reason and every failed test's whole output. Without the PAM
# headers the tests that build pam_npurun.so or the PAM helper skip, and
# say so (not in CI); the helper (tests/pamhelper, build tag pamhelper) is
# vetted where they are.
test: SHELL := /bin/bash
test: .SHELLFLAGS := -o pipefail -c
test:
	$(GO) vet ./...
	@if $(pam_headers); then echo "$(GO) vet -tags pamhelper ./tests/pamhelper"; $(GO) vet -tags pamhelper ./tests/pamhelper; \
	else echo "no PAM headers (libpam0g-dev): the PAM tests skip, and tests/pamhelper is not vetted"; fi
	$(GO) build -o $(BUILDDIR)/.testsummary ./tests/testsummary
	{ $(GO) test -race -count=1 -timeout 20m -json $$($(GO) list ./... | grep -v '/tests/'); unit=$$?; \
	  $(GO) test -race -count=1 -timeout 20m -json -p 1 ./tests/...; e2e=$$?; \
	  exit $$((unit | e2e)); } 2>&1 | $(BUILDDIR)/.testsummary

# The demo needs no PAM module (nor its headers).
demo: $(BUILDDIR)/npubroker $(BUILDDIR)/npurun $(BUILDDIR)/task-submit $(BUILDDIR)/npurun-supervise
	@bash tests/demo.sh $(BUILDDIR)

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 30m -p 1 ./tests/bench/ ./broker/lease/

# Backfill against a real Slurm (issue 31): a private single-node Slurm
# beside the broker, half an hour; not in make bench, make test or CI.
bench-slurm: build
	NPURUN_BENCH_SLURM=1 $(GO) test -run '^$$' -bench 'BenchmarkBackfillSlurm' -benchtime 1x -count 1 -timeout 60m -v ./tests/bench/

man:
	@ls man/*.[0-9]

install: build units completions
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SBINDIR) $(DESTDIR)$(LIBEXECDIR)/npurun $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(SYSTEMDDIR) $(DESTDIR)$(SYSCONFDIR)/npurun $(DESTDIR)$(PAMDIR)
	install -d $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR)
	install -m 0755 $(BUILDDIR)/npurun $(DESTDIR)$(BINDIR)/npurun
	install -m 0755 $(BUILDDIR)/task-submit $(DESTDIR)$(BINDIR)/task-submit
	install -m 0755 $(BUILDDIR)/npubroker $(DESTDIR)$(SBINDIR)/npubroker
	install -m 0755 $(BUILDDIR)/npuboard $(DESTDIR)$(SBINDIR)/npuboard
	install -m 0755 $(BUILDDIR)/npurun-supervise $(DESTDIR)$(SUPERVISOR)
	install -m 0755 $(BUILDDIR)/npurun-slurm $(DESTDIR)$(SLURM_SCRIPT)
	if [ "$(SPANK)" != no ] && [ -e $(BUILDDIR)/spank_npurun.so ]; then install -d $(DESTDIR)$(SPANKDIR) && install -m 0644 $(BUILDDIR)/spank_npurun.so $(DESTDIR)$(SPANKDIR)/spank_npurun.so; fi
	install -m 0755 $(BUILDDIR)/npurun-runtime $(DESTDIR)$(RUNTIME)
	install -m 0755 $(BUILDDIR)/npurun-runtime-create $(DESTDIR)$(RUNTIME_CREATE)
	install -m 0755 pam/remove-check.sh $(DESTDIR)$(REMOVE_CHECK)
	install -m 0644 $(BUILDDIR)/pam_npurun.so $(DESTDIR)$(PAMDIR)/pam_npurun.so
	install -m 0644 $(MAN1) $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 $(MAN5) $(DESTDIR)$(MANDIR)/man5/
	install -m 0644 $(MAN8) $(DESTDIR)$(MANDIR)/man8/
	install -m 0644 $(BUILDDIR)/npubroker.service $(DESTDIR)$(SYSTEMDDIR)/npubroker.service
	install -m 0644 $(BUILDDIR)/npubroker.socket $(DESTDIR)$(SYSTEMDDIR)/npubroker.socket
	install -m 0644 $(BUILDDIR)/npuboard.service $(DESTDIR)$(SYSTEMDDIR)/npuboard.service
	for p in $(COMPLETION_PROGS); do \
		install -m 0644 $(BUILDDIR)/completion/bash/$$p $(DESTDIR)$(BASHCOMPDIR)/$$p && \
		install -m 0644 $(BUILDDIR)/completion/zsh/_$$p $(DESTDIR)$(ZSHCOMPDIR)/_$$p && \
		install -m 0644 $(BUILDDIR)/completion/fish/$$p.fish $(DESTDIR)$(FISHCOMPDIR)/$$p.fish || exit 1; \
	done
	test -e $(DESTDIR)$(SYSCONFDIR)/npurun/npurun.conf || install -m 0644 broker/dist/npurun.conf $(DESTDIR)$(SYSCONFDIR)/npurun/npurun.conf

# remove_same INSTALLED SOURCE: remove INSTALLED if it is SOURCE, byte for
# byte; otherwise leave it and say so.
remove_same = if [ -e '$(1)' ] || [ -L '$(1)' ]; then \
	if cmp -s '$(2)' '$(1)'; then rm -f '$(1)' && echo "removed $(1)"; \
	else echo "left $(1): it is not what this tree installs there" >&2; fi; fi

# The check that nothing still needs what uninstall removes: a PAM
# configuration under $(DESTDIR) that loads this install's module (by its
# path, or its bare name where PAMDIR is a system directory), or an sshd
# ForceCommand that runs this install's npurun (by its path, or by name
# where BINDIR is on sshd's PATH). pam/remove-check.sh, which the Debian
# packages' prerm runs too (installed as npurun-remove-check): one check.
REMOVE_CHECK = $(LIBEXECDIR)/npurun/npurun-remove-check
PAM_BARE = $(if $(filter /lib/% /lib64/% /usr/lib/% /usr/lib64/%,$(PAMDIR)),--bare)
NPURUN_BARE = $(if $(filter /usr/bin /bin /usr/local/bin,$(BINDIR)),--bare-npurun)

uninstall: build units completions
	@sh pam/remove-check.sh --prog='make uninstall' --force=FORCE=1 --root='$(DESTDIR)' \
		--module='$(PAMDIR)/pam_npurun.so' $(PAM_BARE) --npurun='$(BINDIR)/npurun' $(NPURUN_BARE) \
		$(if $(filter 1,$(FORCE)),--forced)
	@$(call remove_same,$(DESTDIR)$(BINDIR)/npurun,$(BUILDDIR)/npurun)
	@$(call remove_same,$(DESTDIR)$(BINDIR)/task-submit,$(BUILDDIR)/task-submit)
	@$(call remove_same,$(DESTDIR)$(SBINDIR)/npubroker,$(BUILDDIR)/npubroker)
	@$(call remove_same,$(DESTDIR)$(SBINDIR)/npuboard,$(BUILDDIR)/npuboard)
	@$(call remove_same,$(DESTDIR)$(SUPERVISOR),$(BUILDDIR)/npurun-supervise)
	@$(call remove_same,$(DESTDIR)$(SLURM_SCRIPT),$(BUILDDIR)/npurun-slurm)
	@if [ -e $(BUILDDIR)/spank_npurun.so ]; then $(call remove_same,$(DESTDIR)$(SPANKDIR)/spank_npurun.so,$(BUILDDIR)/spank_npurun.so); fi
	@rmdir '$(DESTDIR)$(SPANKDIR)' 2>/dev/null || true
	@$(call remove_same,$(DESTDIR)$(RUNTIME),$(BUILDDIR)/npurun-runtime)
	@$(call remove_same,$(DESTDIR)$(RUNTIME_CREATE),$(BUILDDIR)/npurun-runtime-create)
	@$(call remove_same,$(DESTDIR)$(REMOVE_CHECK),pam/remove-check.sh)
	@rmdir '$(DESTDIR)$(LIBEXECDIR)/npurun' 2>/dev/null || true
	@$(call remove_same,$(DESTDIR)$(PAMDIR)/pam_npurun.so,$(BUILDDIR)/pam_npurun.so)
	@$(foreach p,$(MAN1),$(call remove_same,$(DESTDIR)$(MANDIR)/man1/$(notdir $(p)),$(p));)
	@$(foreach p,$(MAN5),$(call remove_same,$(DESTDIR)$(MANDIR)/man5/$(notdir $(p)),$(p));)
	@$(foreach p,$(MAN8),$(call remove_same,$(DESTDIR)$(MANDIR)/man8/$(notdir $(p)),$(p));)
	@$(call remove_same,$(DESTDIR)$(SYSTEMDDIR)/npubroker.service,$(BUILDDIR)/npubroker.service)
	@$(call remove_same,$(DESTDIR)$(SYSTEMDDIR)/npubroker.socket,$(BUILDDIR)/npubroker.socket)
	@$(call remove_same,$(DESTDIR)$(SYSTEMDDIR)/npuboard.service,$(BUILDDIR)/npuboard.service)
	@$(foreach p,$(COMPLETION_PROGS),$(call remove_same,$(DESTDIR)$(BASHCOMPDIR)/$(p),$(BUILDDIR)/completion/bash/$(p)); \
		$(call remove_same,$(DESTDIR)$(ZSHCOMPDIR)/_$(p),$(BUILDDIR)/completion/zsh/_$(p)); \
		$(call remove_same,$(DESTDIR)$(FISHCOMPDIR)/$(p).fish,$(BUILDDIR)/completion/fish/$(p).fish);)
	@if [ -e '$(DESTDIR)$(SYSCONFDIR)/npurun/npurun.conf' ]; then echo "kept $(DESTDIR)$(SYSCONFDIR)/npurun/npurun.conf: the administrator's, to remove by hand"; fi

clean:
	rm -rf $(BUILDDIR)

# Debian packages: npurun and libpam-npurun (debian/), built by plain dh over
# this Makefile from a copy of the tree (the files git knows, committed or
# not, else all but .git and $(BUILDDIR)) with the vendored modules, offline.
# Needs dpkg-dev and debhelper (and this Makefile's Go and C compiler).
# make deb-test installs, upgrades and purges them on this machine, in a
# mount namespace of its own (tests/packaging/deb_test.go); as root, for CI.
DEBDIR      ?= $(BUILDDIR)/deb
VENDORDIR   ?= $(BUILDDIR)/vendor
DEB_BASE     = $(shell head -n 1 debian/changelog | cut -d ' ' -f 2 | tr -d '()')
DEB_VERSION ?= $(DEB_BASE)$(shell TZ=UTC git log -1 --date=format-local:%Y%m%d%H%M%S --format=+git%cd.%h 2>/dev/null)
DEB_STAGE    = $(DEBDIR)/npurun-$(DEB_VERSION)

deb-vendor: $(VENDORDIR)/modules.txt

$(VENDORDIR)/modules.txt: go.mod go.sum
	rm -rf $(VENDORDIR)
	$(GO) mod vendor -o $(VENDORDIR)

deb: $(VENDORDIR)/modules.txt
	@for t in dpkg-buildpackage dh; do command -v $$t >/dev/null || { echo "make deb needs $$t: apt-get install dpkg-dev debhelper" >&2; exit 1; }; done
	rm -rf '$(DEB_STAGE)'
	mkdir -p '$(DEB_STAGE)'
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
		git ls-files -d > '$(DEB_STAGE).deleted' && git ls-files -co --exclude-standard | grep -vxFf '$(DEB_STAGE).deleted'; \
	else find . -path ./.git -prune -o -path './$(BUILDDIR)' -prune -o -path ./vendor -prune -o \( -type f -o -type l \) -print; \
	fi | tar -cf - -T - | tar -xf - -C '$(DEB_STAGE)'
	rm -f '$(DEB_STAGE).deleted'
	cp -R '$(VENDORDIR)' '$(DEB_STAGE)/vendor'
	if [ '$(DEB_VERSION)' != '$(DEB_BASE)' ]; then \
		{ printf 'npurun (%s) unstable; urgency=medium\n\n  * Built by make deb from %s.\n\n -- %s  %s\n\n' '$(DEB_VERSION)' \
			"$$(git describe --always --dirty 2>/dev/null || echo 'a tree without git')" \
			"$$(sed -n 's/^Maintainer: //p' debian/control)" "$$(git log -1 --format=%cD 2>/dev/null || date -R)"; \
			cat debian/changelog; } > '$(DEB_STAGE)/debian/changelog'; \
	fi
	cd '$(DEB_STAGE)' && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES -u DESTDIR \
		GO="$$(command -v $(GO))" GOCACHE="$$($(GO) env GOCACHE)" dpkg-buildpackage -b -us -uc
	rm -rf '$(DEB_STAGE)'
	@ls -l $(DEBDIR)/*_$(DEB_VERSION)_*.deb

deb-test:
	$(GO) test -tags debtest -count=1 -v -timeout 60m -run '^TestDebPackages$$' ./tests/packaging/
