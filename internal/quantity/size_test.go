package quantity

import (
	"errors"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  string
	}{
		{in: "12G", want: 12 * 1024},
		{in: "12", want: 12 * 1024},
		{in: "12GiB", want: 12 * 1024},
		{in: "12gb", want: 12 * 1024},
		{in: "512M", want: 512},
		{in: "512MiB", want: 512},
		{in: "1.5T", want: 1536 * 1024},
		{in: "1.5G", want: 1536},
		{in: "100K", want: 1},
		{in: "0.0001", want: 1},
		{in: "", bad: "empty"},
		{in: "0", bad: "zero"},
		{in: "-1G", bad: "negative"},
		{in: "G", bad: "a number must come first"},
		{in: "12X", bad: `unknown unit "X" (K, M, G or T)`},
		{in: "12Gibibytes", bad: `unknown unit "Gibibytes" (K, M, G or T)`},
		{in: "2000T", bad: "more than 1P"},
		{in: "1.2.3G", bad: `"1.2.3" is not a number`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseSize(tc.in)
			if tc.bad != "" {
				var se *SizeError
				if !errors.As(err, &se) || se.Reason != tc.bad {
					t.Fatalf("ParseSize(%q) = %d, %v; want the error %q", tc.in, got, err, tc.bad)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestSize(t *testing.T) {
	for _, tc := range []struct {
		mib  int64
		want string
	}{
		{12 * 1024, "12G"}, {512, "512M"}, {1536, "1.5G"}, {10035, "9.8G"}, {64 * 1024, "64G"}, {1, "1M"}, {1023, "1023M"}, {2047, "2G"},
	} {
		if got := Size(tc.mib); got != tc.want {
			t.Errorf("Size(%d) = %q, want %q", tc.mib, got, tc.want)
		}
	}
	for _, mib := range []int64{1024, 512, 1536, 64 * 1024} {
		if back, err := ParseSize(Size(mib)); err != nil || back != mib {
			t.Errorf("ParseSize(Size(%d)) = %d, %v", mib, back, err)
		}
	}
}
