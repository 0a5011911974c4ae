package policy

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestParseBoard: [board]'s defaults, its values, and each bad value
// named with its line.
func TestParseBoard(t *testing.T) {
	c, err := Parse("npurun.conf", []byte("[devices]\nvendor = \"fake\"\nids = \"0\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Board{Listen: "127.0.0.1:9401", Refresh: 5 * time.Second}); !reflect.DeepEqual(c.Board, want) {
		t.Errorf("default Board = %+v, want %+v", c.Board, want)
	}
	c, err = Parse("npurun.conf", []byte(`[board]
listen = "0.0.0.0:8080"
refresh = "2s"
peers = ["http://box2:9401", "https://box3.lab:9401/", "http://box2:9401"]
`))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Board{Listen: "0.0.0.0:8080", Refresh: 2 * time.Second, Peers: []string{"http://box2:9401", "https://box3.lab:9401/"}}); !reflect.DeepEqual(c.Board, want) {
		t.Errorf("Board = %+v, want %+v", c.Board, want)
	}
	for _, tt := range []struct{ conf, want string }{
		{`listen = "box1"`, `npurun.conf:2: [board] listen: want host:port such as "127.0.0.1:9401"`},
		{`listen = "box1:http"`, `npurun.conf:2: [board] listen: want host:port`},
		{`refresh = "0s"`, `npurun.conf:2: [board] refresh: must be at least "1s"`},
		{`refresh = "soon"`, `npurun.conf:2: [board] refresh:`},
		{`peers = "http://box2:9401"`, `npurun.conf:2: [board] peers: must be an array of strings`},
		{`peers = ["box2:9401"]`, `npurun.conf:2: [board] peers: want URLs of npuboards such as "http://box2:9401", not "box2:9401"`},
		{`peers = ["ftp://box2"]`, `not "ftp://box2"`},
		{`peers = ["http://u:p@box2:9401"]`, `not "http://u:p@box2:9401"`},
		{`peers = ["http://box2:9401/api/status"]`, `not "http://box2:9401/api/status"`},
		{`colour = "red"`, `npurun.conf:2: [board] colour: unknown key`},
	} {
		_, err := Parse("npurun.conf", []byte("[board]\n"+tt.conf+"\n"))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want one containing %q", tt.conf, err, tt.want)
		}
	}
}
