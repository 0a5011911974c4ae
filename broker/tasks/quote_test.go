package tasks

import (
	"strings"
	"testing"
)

// TestShellQuote: a word is shown as it is when made only of the
// characters a shell takes bare, else single-quoted; the same words as
// the cutset test this replaced (strings.Trim) left bare.
func TestShellQuote(t *testing.T) {
	const bare = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%"
	old := func(s string) string {
		if s != "" && strings.Trim(s, bare) == "" {
			return s
		}
		return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	for _, s := range []string{"", "train.py", "--lr=3e-4", "a b", "it's", "é", "\xff", "x\x00", "$HOME", "a;b", "~", "*", "100%", "user@host:/p,q+r"} {
		if got, want := shellQuote(s), old(s); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", s, got, want)
		}
	}
	for c := 0; c < 256; c++ {
		s := "a" + string(rune(c)) + string([]byte{byte(c)})
		if got, want := shellQuote(s), old(s); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", s, got, want)
		}
	}
}
