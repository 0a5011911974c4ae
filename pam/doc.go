// Package pam decides what a login session on a restricted account gets from the broker: a lease, hidden devices or a refusal.
package pam
