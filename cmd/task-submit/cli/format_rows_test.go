package cli

import (
	"bufio"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/npurun/npurun/wire"
)

// TestRowsAsTabwriter: list's table written straight out is, byte for
// byte, what text/tabwriter writes of the same rows, for random cells
// (wide and combining characters, empty cells, long commands); and cells
// with what tabwriter reads as more than text go through tabwriter.
func TestRowsAsTabwriter(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	alphabet := []string{"a", "Z", "0", " ", "é", "日本", "\u0301", "…", "-", "'", "\u00a0", "🙂"}
	word := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	for round := range 300 {
		cols := 2 + rng.IntN(5)
		rows := [][]string{}
		var ts []wire.TaskInfo
		for i := range 1 + rng.IntN(30) {
			row := make([]string, cols)
			for c := range row {
				row[c] = word(rng.IntN(12))
			}
			rows = append(rows, row)
			if i > 0 {
				ts = append(ts, wire.TaskInfo{Name: word(rng.IntN(120))})
			}
		}
		widths, lasts := layoutRows(rows, ts, nil)
		if !plainCells(rows, lasts) {
			t.Fatalf("round %d: cells without tabs or line breaks taken for special", round)
		}
		var padded, tab strings.Builder
		if err := writeRowsPadded(bufio.NewWriter(&padded), rows, widths, lasts); err != nil {
			t.Fatal(err)
		}
		if err := writeRowsTabwriter(bufio.NewWriter(&tab), rows, lasts); err != nil {
			t.Fatal(err)
		}
		if padded.String() != tab.String() {
			t.Fatalf("round %d: written straight out:\n%s\nby tabwriter:\n%s", round, padded.String(), tab.String())
		}
		var whole strings.Builder
		if err := writeRows(&whole, rows, ts); err != nil || whole.String() != tab.String() {
			t.Fatalf("round %d: writeRows wrote (%v):\n%s\ntabwriter:\n%s", round, err, whole.String(), tab.String())
		}
	}
	for _, odd := range []string{"a\tb", "a\nb", "a\vb", "a\fb", "a\xffb\xff"} {
		rows := [][]string{{"ID", "STATE"}, {"1", odd}}
		ts := []wire.TaskInfo{{Name: "x"}}
		_, lasts := layoutRows(rows, ts, nil)
		if plainCells(rows, lasts) {
			t.Errorf("cell %q taken for plain text", odd)
		}
		var whole, tab strings.Builder
		writeRows(&whole, rows, ts)
		writeRowsTabwriter(bufio.NewWriter(&tab), rows, lasts)
		if whole.String() != tab.String() {
			t.Errorf("cell %q: writeRows wrote %q, tabwriter %q", odd, whole.String(), tab.String())
		}
	}
}
