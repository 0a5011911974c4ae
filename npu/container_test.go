package npu

import (
	"path/filepath"
	"reflect"
	"testing"
)

func TestContainerEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		vendor  Vendor
		devices []int
		want    []string
	}{
		{"ascend renumbers from 0 in the host's order", Ascend, []int{5, 3},
			[]string{"NPURUN_DEVICES=5,3", "ASCEND_RT_VISIBLE_DEVICES=0,1", "ASCEND_VISIBLE_DEVICES=5,3"}},
		{"fake as ascend", Fake, []int{2},
			[]string{"NPURUN_DEVICES=2", "ASCEND_RT_VISIBLE_DEVICES=0", "ASCEND_VISIBLE_DEVICES=2"}},
		{"nvidia", NVIDIA, []int{1, 6, 7},
			[]string{"NPURUN_DEVICES=1,6,7", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=0,1,2", "NVIDIA_VISIBLE_DEVICES=1,6,7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ContainerEnv(tc.vendor, tc.devices); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ContainerEnv(%s, %v) = %q, want %q", tc.vendor, tc.devices, got, tc.want)
			}
		})
	}
}

// The i-th entry of NPURUN_DEVICES inside is the i-th of the host's, which
// Env orders by logical id: DevicesOf reads it back in that order.
func TestContainerEnvFollowsHostOrder(t *testing.T) {
	inv := &Inventory{Vendor: Ascend, IDs: []int{3, 5}, Logical: map[int]int{3: 1, 5: 0}}
	host := inv.Env([]int{3, 5})
	devices := DevicesOf(host)
	if want := []int{5, 3}; !reflect.DeepEqual(devices, want) {
		t.Fatalf("DevicesOf(%q) = %v, want %v", host, devices, want)
	}
	got := ContainerEnv(Ascend, devices)
	if got[0] != "NPURUN_DEVICES=5,3" || got[1] != "ASCEND_RT_VISIBLE_DEVICES=0,1" {
		t.Errorf("inside: %q", got)
	}
}

func TestDevicesOf(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want []int
	}{
		{[]string{"A=1", "NPURUN_DEVICES=4,1"}, []int{4, 1}},
		{[]string{"NPURUN_DEVICES=1", "NPURUN_DEVICES=2"}, []int{2}},
		{[]string{"NPURUN_DEVICES="}, nil},
		{[]string{"NPURUN_DEVICES=1,x"}, nil},
		{[]string{"NPURUN_DEVICES=-1"}, nil},
		{nil, nil},
	} {
		if got := DevicesOf(tc.env); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("DevicesOf(%q) = %v, want %v", tc.env, got, tc.want)
		}
	}
}

func TestContainerNodes(t *testing.T) {
	dir := fakeDev(t, "davinci0", "davinci1", "davinci_manager", "hisi_hdc")
	got := ContainerNodes(Ascend, dir, []int{1})
	want := []string{filepath.Join(dir, "davinci1"), filepath.Join(dir, "davinci_manager"), filepath.Join(dir, "hisi_hdc")}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ContainerNodes = %q, want %q (devmm_svm is missing: left out)", got, want)
	}
	if got := ContainerNodes(Fake, dir, []int{1}); len(got) != 0 {
		t.Errorf("fake devices have no nodes, got %q", got)
	}
	nv := fakeDev(t, "nvidia2", "nvidiactl", "nvidia-uvm")
	want = []string{filepath.Join(nv, "nvidia2"), filepath.Join(nv, "nvidiactl"), filepath.Join(nv, "nvidia-uvm")}
	if got := ContainerNodes(NVIDIA, nv, []int{2}); !reflect.DeepEqual(got, want) {
		t.Errorf("ContainerNodes(nvidia) = %q, want %q", got, want)
	}
}

func TestNodeID(t *testing.T) {
	for _, tc := range []struct {
		vendor Vendor
		path   string
		id     int
		ok     bool
	}{
		{Ascend, "/dev/davinci12", 12, true},
		{Ascend, "davinci0", 0, true},
		{Ascend, "/dev/davinci_manager", 0, false},
		{Ascend, "/dev/davinci", 0, false},
		{Ascend, "/dev/nvidia0", 0, false},
		{NVIDIA, "/dev/nvidia3", 3, true},
		{NVIDIA, "/dev/nvidiactl", 0, false},
		{Fake, "/dev/davinci1", 0, false},
	} {
		id, ok := NodeID(tc.vendor, tc.path)
		if id != tc.id || ok != tc.ok {
			t.Errorf("NodeID(%s, %q) = %d, %v; want %d, %v", tc.vendor, tc.path, id, ok, tc.id, tc.ok)
		}
	}
}

func TestVendorOf(t *testing.T) {
	dir := fakeDev(t, "davinci0", "davinci1")
	for _, tc := range []struct {
		name    string
		env     []string
		devices []int
		want    Vendor
	}{
		{"cuda", []string{"NPURUN_DEVICES=1", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=1"}, []int{1}, NVIDIA},
		{"ascend with its nodes", []string{"NPURUN_DEVICES=1", "ASCEND_RT_VISIBLE_DEVICES=1"}, []int{0, 1}, Ascend},
		{"a node missing: fake", []string{"NPURUN_DEVICES=2", "ASCEND_RT_VISIBLE_DEVICES=2"}, []int{1, 2}, Fake},
		{"hidden cuda, ascend's set", []string{"CUDA_VISIBLE_DEVICES=", "ASCEND_RT_VISIBLE_DEVICES=0"}, []int{0}, Ascend},
		{"nothing", nil, nil, Fake},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := VendorOf(tc.env, dir, tc.devices); got != tc.want {
				t.Errorf("VendorOf = %q, want %q", got, tc.want)
			}
		})
	}
}
