package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/npurun/npurun/wire"
)

// WriteConf replaces the broker's configuration file with conf, whole
// (a rename), as an administrator's editor does.
func WriteConf(t testing.TB, b *Broker, conf string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(b.Conf), ".npurun.conf.new")
	if err := os.WriteFile(tmp, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, b.Conf); err != nil {
		t.Fatal(err)
	}
}

// Reload runs npubroker reload --json as root and returns its status,
// its answer (status 0) and its standard error.
func Reload(t testing.TB, b *Broker) (int, wire.ReloadInfo, string) {
	t.Helper()
	code, out, errs := DrainCmd(t, b, nil, "reload", "--json")
	var info wire.ReloadInfo
	if code == 0 {
		if err := json.Unmarshal([]byte(out), &info); err != nil {
			t.Fatalf("reload --json printed what does not parse: %v\n%s", err, out)
		}
	}
	return code, info, errs
}

// ShareConfig is n fake devices, every one shared, each with capacity
// (a size such as "16G") for its shares and no margin.
func ShareConfig(n int, capacity string) string {
	return FakeConfig(n) + fmt.Sprintf("[share]\npools = \"all\"\ncapacity = %q\nmargin = \"0\"\n", capacity)
}
