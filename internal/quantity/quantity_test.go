package quantity

import (
	"errors"
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	for _, tt := range []struct {
		in   time.Duration
		want string
	}{
		{0, "0s"},
		{250 * time.Microsecond, "250µs"},
		{850 * time.Millisecond, "850ms"},
		{999*time.Millisecond + 400*time.Microsecond, "999ms"},
		{999*time.Millisecond + 600*time.Microsecond, "1s"},
		{time.Second, "1s"},
		{1499 * time.Millisecond, "1s"},
		{45 * time.Second, "45s"},
		{90 * time.Minute, "1h30m"},
		{3 * time.Hour, "3h"},
		{2*time.Hour + 27*time.Second, "2h27s"},
		{2*time.Hour + 26*time.Second + 600*time.Millisecond, "2h27s"},
		{30 * time.Hour, "1d6h"},
		{Day + 2*time.Hour + 3*time.Minute + 4*time.Second, "1d2h3m4s"},
		{400 * Day, "400d"},
		{-90 * time.Second, "-1m30s"},
		{1<<63 - 1, "106751d23h47m16s"},
		{-1 << 63, "-106751d23h47m16s"},
	} {
		if got := Duration(tt.in); got != tt.want {
			t.Errorf("Duration(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestApprox(t *testing.T) {
	for _, tt := range []struct {
		in   time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{500 * time.Millisecond, "0s"},
		{12*time.Second + 900*time.Millisecond, "12s"},
		{59*time.Second + 999*time.Millisecond, "59s"},
		{40*time.Minute + 59*time.Second, "40m"},
		{2*time.Hour + 13*time.Minute + 59*time.Second, "2h13m"},
		{2*time.Hour + 30*time.Second, "2h"},
		{3*Day + 4*time.Hour + 59*time.Minute, "3d4h"},
	} {
		if got := Approx(tt.in); got != tt.want {
			t.Errorf("Approx(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseDuration(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{in: "0", want: 0},
		{in: "0s", want: 0},
		{in: "45s", want: 45 * time.Second},
		{in: "90m", want: 90 * time.Minute},
		{in: "1.5h", want: 90 * time.Minute},
		{in: "850ms", want: 850 * time.Millisecond},
		{in: "1d", want: Day},
		{in: "1d12h", want: 36 * time.Hour},
		{in: "2w", want: 14 * Day},
		{in: "2h27s", want: 2*time.Hour + 27*time.Second},
		{in: "+5m", want: 5 * time.Minute},
		{in: "10us", want: 10 * time.Microsecond},
		{in: "10µs", want: 10 * time.Microsecond},
		{in: "1ns", want: 1},
		{in: "106751d23h47m16s854775807ns", want: 1<<63 - 1},
		{in: "", err: `bad duration "": empty`},
		{in: "-5m", err: `bad duration "-5m": negative`},
		{in: "5", err: `bad duration "5": no unit after 5 (d, h, m, s or ms)`},
		{in: "1x", err: `bad duration "1x": unknown unit "x" (d, h, m, s or ms)`},
		{in: "1 d", err: `bad duration "1 d": unknown unit " d" (d, h, m, s or ms)`},
		{in: "h", err: `bad duration "h": a number must come before "h"`},
		{in: "1..2s", err: `bad duration "1..2s": "1..2" is not a number`},
		{in: "300y", err: `bad duration "300y": unknown unit "y" (d, h, m, s or ms)`},
		{in: "107000d", err: `bad duration "107000d": longer than 292 years`},
		{in: "106751d23h47m17s", err: `bad duration "106751d23h47m17s": longer than 292 years`},
	} {
		got, err := ParseDuration(tt.in)
		switch {
		case tt.err != "" && (err == nil || err.Error() != tt.err):
			t.Errorf("ParseDuration(%q) = %v, %v; want error %q", tt.in, got, err, tt.err)
		case tt.err == "" && (err != nil || got != tt.want):
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
		var de *DurationError
		if err != nil && !errors.As(err, &de) {
			t.Errorf("ParseDuration(%q): error %T, want *DurationError", tt.in, err)
		}
	}
}

// TestRoundTrip: what Duration writes, ParseDuration reads back, to the
// second.
func TestRoundTrip(t *testing.T) {
	for _, d := range []time.Duration{time.Second, 59 * time.Second, 61 * time.Minute, 25*time.Hour + time.Second, 400*Day + 7*time.Minute, 850 * time.Millisecond} {
		got, err := ParseDuration(Duration(d))
		if err != nil || got != d {
			t.Errorf("ParseDuration(Duration(%v) = %q) = %v, %v", d, Duration(d), got, err)
		}
	}
}

func TestDurationErrorFor(t *testing.T) {
	_, err := ParseDuration("1x")
	var de *DurationError
	if !errors.As(err, &de) {
		t.Fatalf("error %v is not a *DurationError", err)
	}
	if got, want := de.For("--timeout"), `bad duration "1x" for --timeout: unknown unit "x" (d, h, m, s or ms)`; got != want {
		t.Errorf("For = %q, want %q", got, want)
	}
}

func TestCount(t *testing.T) {
	for _, tt := range []struct {
		n    int
		want string
	}{{0, "0 devices"}, {1, "1 device"}, {2, "2 devices"}} {
		if got := Count(tt.n, "device", "devices"); got != tt.want {
			t.Errorf("Count(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}

func TestList(t *testing.T) {
	if got, want := List("uid", "uids", []uint32{1011}), "uid 1011"; got != want {
		t.Errorf("List = %q, want %q", got, want)
	}
	if got, want := List("uid", "uids", []uint32{1011, 1012}), "uids 1011, 1012"; got != want {
		t.Errorf("List = %q, want %q", got, want)
	}
}
