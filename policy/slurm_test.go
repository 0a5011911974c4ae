package policy

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSlurmParse(t *testing.T) {
	tests := []struct {
		name string
		conf string
		want Slurm
	}{
		{"absent", "[devices]\nvendor = \"fake\"\nids = \"0-7\"\n",
			Slurm{Mode: "split", GRES: "gpu", PollInterval: 2 * time.Second}},
		{"split, no pools", "[devices]\nvendor = \"fake\"\nids = \"0-7\"\n[slurm]\ngres_devices = \"4-7\"\n",
			Slurm{Devices: []int{4, 5, 6, 7}, Mode: "split", GRES: "gpu", PollInterval: 2 * time.Second}},
		{"order kept", "[devices]\nvendor = \"fake\"\nids = \"0-7\"\n[slurm]\ngres_devices = \"6-7,4,5\"\n",
			Slurm{Devices: []int{6, 7, 4, 5}, Mode: "split", GRES: "gpu", PollInterval: 2 * time.Second}},
		{"split with own pools", `[devices]
vendor = "fake"
ids = "0-7"
[pools]
interactive = "0-1"
queue = "2-3"
[slurm]
gres_devices = "4-7"
gres_name = "npu"
gres_conf = "/etc/slurm/gres.conf"
node = "box1"
`, Slurm{Devices: []int{4, 5, 6, 7}, Mode: "split", GRES: "npu", GresConf: "/etc/slurm/gres.conf", Node: "box1", PollInterval: 2 * time.Second}},
		{"allocate, all Slurm's", `[devices]
vendor = "fake"
ids = "0-3"
[slurm]
gres_devices = "0-3"
mode = "allocate"
partition = "npu"
poll_interval = "5s"
`, Slurm{Devices: []int{0, 1, 2, 3}, Mode: "allocate", GRES: "gpu", Partition: "npu", PollInterval: 5 * time.Second}},
		{"allocate with a pool of Slurm's", `[devices]
vendor = "fake"
ids = "0-7"
[pools]
mine = "0-3"
slurm = "4-7"
[slurm]
gres_devices = "4-7"
mode = "allocate"
`, Slurm{Devices: []int{4, 5, 6, 7}, Mode: "allocate", GRES: "gpu", PollInterval: 2 * time.Second}},
		{"no ids in [devices]", "[slurm]\ngres_devices = \"0-3\"\n",
			Slurm{Devices: []int{0, 1, 2, 3}, Mode: "split", GRES: "gpu", PollInterval: 2 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("npurun.conf", []byte(tt.conf))
			if err != nil {
				t.Fatal(err)
			}
			got := c.Slurm
			if !slices.Equal(got.Devices, tt.want.Devices) || got.Mode != tt.want.Mode || got.GRES != tt.want.GRES ||
				got.GresConf != tt.want.GresConf || got.Node != tt.want.Node || got.Partition != tt.want.Partition ||
				got.PollInterval != tt.want.PollInterval {
				t.Errorf("Slurm = %+v, want %+v", got, tt.want)
			}
			if got.Active() != (tt.want.Devices != nil) {
				t.Errorf("Active() = %v", got.Active())
			}
		})
	}
}

func TestSlurmParseBad(t *testing.T) {
	const base = "[devices]\nvendor = \"fake\"\nids = \"0-7\"\n"
	tests := []struct {
		name, conf, want string
	}{
		{"no devices", "[slurm]\nmode = \"split\"\n",
			`npurun.conf:4: [slurm]: names no devices: give gres_devices, the physical ids of Slurm's devices in gres.conf's File= order (e.g. "4-7")`},
		{"empty devices", "[slurm]\ngres_devices = \"\"\n", `npurun.conf:5: [slurm] gres_devices: no devices in ""`},
		{"twice", "[slurm]\ngres_devices = \"4-6,5\"\n", `npurun.conf:5: [slurm] gres_devices: 5 is listed twice`},
		{"bad range", "[slurm]\ngres_devices = \"7-4\"\n", `npurun.conf:5: [slurm] gres_devices: bad range "7-4"`},
		{"outside ids", "[slurm]\ngres_devices = \"6-9\"\n", `npurun.conf:5: [slurm] gres_devices: devices 8-9 not in [devices] ids`},
		{"not a string", "[slurm]\ngres_devices = 4\n", `npurun.conf:5: [slurm] gres_devices: must be a string, not an integer`},
		{"mode", "[slurm]\ngres_devices = \"4-7\"\nmode = \"share\"\n", `npurun.conf:6: [slurm] mode: unknown mode "share" (want "split" or "allocate")`},
		{"unknown key", "[slurm]\ngres_devices = \"4-7\"\ngres = \"gpu\"\n",
			`npurun.conf:6: [slurm] gres: unknown key (known: gres_devices, mode, gres_name, gres_conf, node, partition, poll_interval)`},
		{"gres name", "[slurm]\ngres_devices = \"4-7\"\ngres_name = \"--gpu\"\n", `npurun.conf:6: [slurm] gres_name: bad name "--gpu" (letters, digits, _, . and -)`},
		{"relative gres.conf", "[slurm]\ngres_devices = \"4-7\"\ngres_conf = \"gres.conf\"\n", `npurun.conf:6: [slurm] gres_conf: must be an absolute path, not "gres.conf"`},
		{"poll too fast", "[slurm]\ngres_devices = \"4-7\"\nmode = \"allocate\"\npoll_interval = \"0\"\n[pools]\na = \"0-3\"\nb = \"4-7\"\n", `npurun.conf:7: [slurm] poll_interval: must be at least 1s`},
		{"partition in split mode", "[slurm]\ngres_devices = \"4-7\"\npartition = \"npu\"\n", `npurun.conf:6: [slurm] partition: applies to mode "allocate" only (mode is "split")`},
		{"split pool holds Slurm's", "[pools]\na = \"0-4\"\nb = \"5\"\n[slurm]\ngres_devices = \"4-7\"\n",
			`npurun.conf:5: [pools] a: device 4 is Slurm's ([slurm] gres_devices), which mode "split" leases to Slurm jobs only: take it out of the pool`},
		{"split pool all Slurm's", "[pools]\na = \"0-3\"\nb = \"4-7\"\n[slurm]\ngres_devices = \"4-7\"\n",
			`npurun.conf:6: [pools] b: devices 4-7 are Slurm's ([slurm] gres_devices), which mode "split" leases to Slurm jobs only: take them out of the pool`},
		{"allocate mixed pool", "[pools]\na = \"2-5\"\nb = \"6-7\"\n[slurm]\ngres_devices = \"4-7\"\nmode = \"allocate\"\n",
			`npurun.conf:5: [pools] a: holds Slurm's 4-5 and devices 2-3, which are not: in mode "allocate" a pool holds Slurm's devices only or none`},
		{"allocate no pools", "[slurm]\ngres_devices = \"4-7\"\nmode = \"allocate\"\n",
			`npurun.conf:6: [slurm] mode: mode "allocate": devices 0-3 are not Slurm's, and no [pools] say which requests are Slurm's: give a pool of Slurm's devices and one of the others`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("npurun.conf", []byte(base+tt.conf))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s", tt.conf)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error:\n%s\nwant a line:\n%s", err, tt.want)
			}
		})
	}
}

func TestSlurmMap(t *testing.T) {
	s := Slurm{Devices: []int{4, 5, 6, 7}}
	for _, tt := range []struct {
		positions string
		want      []int
		err       string
	}{
		{"0,1", []int{4, 5}, ""},
		{"3,0", []int{7, 4}, ""},
		{"1-2", []int{5, 6}, ""},
		{"", []int{}, ""},
		{"4", nil, "gres position 4 is past [slurm] gres_devices, which lists 4 devices"},
		{"1,1", nil, "1 is listed twice"},
		{"a", nil, `gres positions "a": bad id "a"`},
	} {
		pos, err := ParsePositions(tt.positions)
		var got []int
		if err == nil {
			got, err = s.Map(pos)
		}
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%q: error %v, want %q", tt.positions, err, tt.err)
		case tt.err == "" && err != nil:
			t.Errorf("%q: %v", tt.positions, err)
		case tt.err == "" && !slices.Equal(got, tt.want):
			t.Errorf("%q: %v, want %v", tt.positions, got, tt.want)
		}
	}
	if _, err := (Slurm{}).Map([]int{0}); err == nil {
		t.Error("Map without [slurm] gave no error")
	}
}

func TestSlurmPoolsAndOwnDevices(t *testing.T) {
	all := []int{0, 1, 2, 3, 4, 5, 6, 7}
	split, err := Parse("npurun.conf", []byte("[devices]\nvendor = \"fake\"\nids = \"0-7\"\n[slurm]\ngres_devices = \"4-7\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := split.OwnDevices(all); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Errorf("split: OwnDevices = %v, want 0-3", got)
	}
	if split.SlurmPool(split.Pools[0], all) {
		t.Error("split: the default pool of all devices taken for Slurm's")
	}
	alloc, err := Parse("npurun.conf", []byte("[devices]\nvendor = \"fake\"\nids = \"0-7\"\n[pools]\nmine = \"0-3\"\nslurm = \"4-7\"\n[slurm]\ngres_devices = \"4-7\"\nmode = \"allocate\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := alloc.OwnDevices(all); !slices.Equal(got, all) {
		t.Errorf("allocate: OwnDevices = %v, want all", got)
	}
	mine, _ := alloc.Pool("mine")
	slurmPool, _ := alloc.Pool("slurm")
	if alloc.SlurmPool(mine, all) || !alloc.SlurmPool(slurmPool, all) {
		t.Errorf("allocate: SlurmPool(mine) = %v, SlurmPool(slurm) = %v; want false, true", alloc.SlurmPool(mine, all), alloc.SlurmPool(slurmPool, all))
	}
}
