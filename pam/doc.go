// Package pam is the session decisions behind the PAM module (pam/module,
// pam_npurun.c): what a login session on a restricted account gets from the
// broker — a lease, hidden devices or a refusal — decided in plain Go in the
// broker, testable without libpam. It must never be linked into sshd (the
// module is C on purpose) and owns no device nodes: package npu does.
package pam
