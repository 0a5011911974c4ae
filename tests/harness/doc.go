// Package harness is what the end-to-end tests under tests/ share: it
// builds the programs once per test binary, starts brokers on real Unix
// sockets in temporary directories, makes test users (useradd, prefix
// npurun-t), fake device trees, a private sshd, dockerd, Podman and Slurm,
// and awaits events (log lines, process exits, pidfds) instead of sleeping.
// It is imported by test packages only; it must never change the machine
// outside temporary directories, except test users that it removes after.
package harness
