package printable

import "testing"

func TestString(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain text, ünïcode ✓", "plain text, ünïcode ✓"},
		{"a\nb\tc\rd", "a?b?c?d"},
		{"\x1b[2Jclear", "?[2Jclear"},
		{"del\x7f c1\u0085 end", "del? c1? end"},
		{"bad \xff\xfe utf8", "bad ?? utf8"},
		{"", ""},
	} {
		if got := String(c.in); got != c.want {
			t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
