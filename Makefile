# npurun — build, test and install.
#
# Variables (override on the command line: make install PREFIX=/usr):
#   PREFIX      install prefix                          (/usr/local)
#   DESTDIR     staging root for packagers              (empty)
#   BINDIR      user commands: npurun, task-submit      ($(PREFIX)/bin)
#   SBINDIR     the daemon: npubroker                   ($(PREFIX)/sbin)
#   MANDIR      man pages                               ($(PREFIX)/share/man)
#   PAMDIR      PAM modules (pam_npurun.so, later)      (/lib/security)
#   SYSTEMDDIR  systemd units                           (/lib/systemd/system)
#   SYSCONFDIR  configuration: npurun/npurun.conf       (/etc)
#   VERSION     version stamped into the binaries       (git describe)
#   GO          the Go toolchain                        (go)

PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
SBINDIR    ?= $(PREFIX)/sbin
MANDIR     ?= $(PREFIX)/share/man
PAMDIR     ?= /lib/security
SYSTEMDDIR ?= /lib/systemd/system
SYSCONFDIR ?= /etc
GO         ?= go
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

GOFLAGS_BUILD = -trimpath -ldflags "-s -w -X main.version=$(VERSION)"
BINARIES = bin/npubroker bin/npurun bin/task-submit
SOURCES = $(shell find . -name '*.go' -not -path './.git/*') go.mod go.sum

.PHONY: all build test race demo bench man install uninstall clean

all: build

build: $(BINARIES)

# npurun is static and lean: it sits in front of every job. npubroker uses
# cgo so that user and group lookups go through NSS (LDAP, sssd).
bin/npurun: $(SOURCES)
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/npurun

bin/task-submit: $(SOURCES)
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/task-submit

bin/npubroker: $(SOURCES)
	@mkdir -p bin
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/npubroker

# The whole suite: unit tests under the race detector, then the end-to-end
# tests of the built binaries. As root with CI=true, tests that need root
# (other users, the PAM stack) must run: a skip is a failure there.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 20m ./...

demo: build
	@bash tests/demo.sh bin

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 30m ./tests/

man:
	@ls man/*.[0-9]

install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SBINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(SYSTEMDDIR) $(DESTDIR)$(SYSCONFDIR)/npurun
	install -m 0755 bin/npurun $(DESTDIR)$(BINDIR)/npurun
	install -m 0755 bin/task-submit $(DESTDIR)$(BINDIR)/task-submit
	install -m 0755 bin/npubroker $(DESTDIR)$(SBINDIR)/npubroker
	install -m 0644 man/*.1 $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 man/*.5 $(DESTDIR)$(MANDIR)/man5/
	install -m 0644 man/*.8 $(DESTDIR)$(MANDIR)/man8/
	sed 's|@SBINDIR@|$(SBINDIR)|g' broker/dist/npubroker.service > $(DESTDIR)$(SYSTEMDDIR)/npubroker.service
	install -m 0644 broker/dist/npubroker.socket $(DESTDIR)$(SYSTEMDDIR)/npubroker.socket
	test -e $(DESTDIR)$(SYSCONFDIR)/npurun/npurun.conf || install -m 0644 broker/dist/npurun.conf $(DESTDIR)$(SYSCONFDIR)/npurun/npurun.conf

# The configuration file is left in place: it is the administrator's.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/npurun $(DESTDIR)$(BINDIR)/task-submit $(DESTDIR)$(SBINDIR)/npubroker
	rm -f $(DESTDIR)$(MANDIR)/man1/npurun.1 $(DESTDIR)$(MANDIR)/man1/task-submit.1 $(DESTDIR)$(MANDIR)/man5/npurun.conf.5 $(DESTDIR)$(MANDIR)/man8/npubroker.8
	rm -f $(DESTDIR)$(SYSTEMDDIR)/npubroker.service $(DESTDIR)$(SYSTEMDDIR)/npubroker.socket

clean:
	rm -rf bin
