// Package docs tests the documents against the programs: the README's and
// man pages' examples run, every option documented, every package's doc
// comment.
package docs

import (
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
