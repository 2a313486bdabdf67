package agent

import (
	"bytes"
	"encoding/binary"
	"isopod/internal/agentproto"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseCmdline(t *testing.T) {
	tests := []struct {
		line string
		want bootParams
		errs int
	}{
		{"console=ttyS0 quiet", bootParams{}, 0},
		{"console=ttyS0 isopod.hostname=box", bootParams{hostname: "box"}, 0},
		{"isopod.debug=1 -- isopod-floor", bootParams{debug: true}, 0},
		{"isopod.hostname=" + strings.Repeat("a", 65), bootParams{}, 1},
		// The disks of the root come as a Mount message now: these are
		// unknown keys, reported.
		{"isopod.layers=3 isopod.bogus=1", bootParams{}, 2},
	}
	for _, tt := range tests {
		got, errs := parseCmdline(tt.line)
		if got != tt.want || len(errs) != tt.errs {
			t.Errorf("parseCmdline(%q) = %+v, %v; want %+v and %d errors", tt.line, got, errs, tt.want, tt.errs)
		}
	}
}

// fakeBlock lays out a /sys/block-like tree and a /dev with the nodes.
func fakeBlock(t *testing.T, disks map[string]string) (sys, dev string) {
	t.Helper()
	root := t.TempDir()
	sys, dev = filepath.Join(root, "sys"), filepath.Join(root, "dev")
	os.MkdirAll(dev, 0o755)
	for name, serial := range disks {
		os.MkdirAll(filepath.Join(sys, name), 0o755)
		if serial != "" {
			os.WriteFile(filepath.Join(sys, name, "serial"), []byte(serial+"\n"), 0o644)
		}
		os.WriteFile(filepath.Join(dev, name), nil, 0o600)
	}
	os.MkdirAll(sys, 0o755)
	return sys, dev
}

func TestWaitDisks(t *testing.T) {
	sys, dev := fakeBlock(t, map[string]string{
		"vda": SerialScratch, "vdb": "isopod-l1", "vdc": SerialBase, "vdd": "isopod-l0", "vde": "", "loop0": "",
	})
	found, err := waitDisks(sys, dev, wantedSerials(agentproto.Mount{Layers: 2, Scratch: true}), time.Second, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if found[SerialBase] != filepath.Join(dev, "vdc") || found[SerialScratch] != filepath.Join(dev, "vda") {
		t.Errorf("found %v", found)
	}
	layers, err := layerDevices(found, 2)
	if err != nil || strings.Join(layers, ",") != filepath.Join(dev, "vdd")+","+filepath.Join(dev, "vdb") {
		t.Errorf("layers = %v, %v; want vdd then vdb", layers, err)
	}

	start := time.Now()
	_, err = waitDisks(sys, dev, wantedSerials(agentproto.Mount{Layers: 3, Scratch: true}), 100*time.Millisecond, 5*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "isopod-l2") {
		t.Errorf("missing layer: err = %v; want it named", err)
	}
	if time.Since(start) > time.Second {
		t.Errorf("the wait was not bounded")
	}
}

func TestWaitDisksAppearLate(t *testing.T) {
	sys, dev := fakeBlock(t, map[string]string{"vda": SerialBase})
	go func() {
		time.Sleep(50 * time.Millisecond)
		os.MkdirAll(filepath.Join(sys, "vdb"), 0o755)
		os.WriteFile(filepath.Join(dev, "vdb"), nil, 0o600)
		os.WriteFile(filepath.Join(sys, "vdb", "serial"), []byte(SerialScratch), 0o644)
	}()
	found, err := waitDisks(sys, dev, wantedSerials(agentproto.Mount{Scratch: true}), 2*time.Second, 2*time.Millisecond)
	if err != nil || found[SerialScratch] == "" {
		t.Errorf("late disk: %v, %v", found, err)
	}
}

func TestLayerGap(t *testing.T) {
	found := map[string]string{SerialBase: "/dev/vda", "isopod-l0": "/dev/vdb", "isopod-l2": "/dev/vdc"}
	if _, err := layerDevices(found, 3); err == nil || !strings.Contains(err.Error(), "isopod-l1") {
		t.Errorf("missing l1: %v", err)
	}
}

func TestLowerDirs(t *testing.T) {
	root := t.TempDir()
	var layers []string
	for i, hasUpper := range []bool{true, false, true} {
		l := filepath.Join(root, "layers", string(rune('0'+i)))
		os.MkdirAll(l, 0o755)
		if hasUpper {
			os.MkdirAll(filepath.Join(l, "upper"), 0o755)
		}
		layers = append(layers, l)
	}
	got, skipped := lowerDirs(layers, "/base")
	want := layers[2] + "/upper:" + layers[0] + "/upper:/base"
	if got != want || len(skipped) != 1 || skipped[0] != layers[1] {
		t.Errorf("lowerDirs = %q, skipped %v; want %q, skipped layer 1", got, skipped, want)
	}
	if got, _ := lowerDirs(nil, "/base"); got != "/base" {
		t.Errorf("no layers: %q", got)
	}
}

func TestFindPort(t *testing.T) {
	root := t.TempDir()
	sys, dev := filepath.Join(root, "sys"), filepath.Join(root, "dev")
	for name, port := range map[string]string{"vport0p0": "org.qemu.guest_agent.0", "vport1p1": PortName} {
		os.MkdirAll(filepath.Join(sys, name), 0o755)
		os.WriteFile(filepath.Join(sys, name, "name"), []byte(port+"\n"), 0o644)
	}
	os.MkdirAll(dev, 0o755)
	if _, err := findPort(sys, dev, PortName); err == nil {
		t.Error("found a port whose device node does not exist")
	}
	os.WriteFile(filepath.Join(dev, "vport1p1"), nil, 0o600)
	got, err := waitPort(sys, dev, PortName, time.Second, time.Millisecond)
	if err != nil || got != filepath.Join(dev, "vport1p1") {
		t.Errorf("waitPort = %q, %v", got, err)
	}
	if _, err := findPort(sys, dev, "other"); err == nil || !strings.Contains(err.Error(), "other") {
		t.Errorf("unknown port: %v", err)
	}
}

func TestReadModuleList(t *testing.T) {
	dir := t.TempDir()
	if mods, err := readModuleList(filepath.Join(dir, "missing")); err != nil || len(mods) != 0 {
		t.Errorf("missing list: %v, %v; want empty", mods, err)
	}
	list := filepath.Join(dir, "modules")
	os.WriteFile(list, []byte("# virtio\n/lib/modules/virtio.ko\n\n  /lib/modules/virtio_blk.ko.xz  \n"), 0o644)
	mods, err := readModuleList(list)
	if err != nil || strings.Join(mods, ",") != "/lib/modules/virtio.ko,/lib/modules/virtio_blk.ko.xz" {
		t.Errorf("readModuleList = %v, %v", mods, err)
	}
	// Loading a module that does not exist fails with its path named.
	if err := loadModule(filepath.Join(dir, "nope.ko")); err == nil || !strings.Contains(err.Error(), "nope.ko") {
		t.Errorf("loadModule of a missing file: %v", err)
	}
}

func TestRouteMessage(t *testing.T) {
	b := routeMessage(3, netip.MustParseAddr("10.0.2.2"), true)
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("parse: %v (%d messages)", err, len(msgs))
	}
	m := msgs[0]
	if m.Header.Type != unix.RTM_NEWROUTE || m.Header.Flags&unix.NLM_F_REPLACE == 0 || m.Header.Flags&unix.NLM_F_ACK == 0 {
		t.Errorf("header %+v", m.Header)
	}
	if m.Data[0] != unix.AF_INET || m.Data[1] != 0 || m.Data[4] != unix.RT_TABLE_MAIN || binary.NativeEndian.Uint32(m.Data[8:]) != unix.RTNH_F_ONLINK {
		t.Errorf("rtmsg % x", m.Data[:unix.SizeofRtMsg])
	}
	attrs, err := syscall.ParseNetlinkRouteAttr(&m)
	if err != nil || len(attrs) != 2 {
		t.Fatalf("attrs: %v, %v", attrs, err)
	}
	if attrs[0].Attr.Type != unix.RTA_GATEWAY || !bytes.Equal(attrs[0].Value, []byte{10, 0, 2, 2}) {
		t.Errorf("gateway attr %+v", attrs[0])
	}
	if attrs[1].Attr.Type != unix.RTA_OIF || binary.NativeEndian.Uint32(attrs[1].Value) != 3 {
		t.Errorf("oif attr %+v", attrs[1])
	}
}

func TestWriteResolvConf(t *testing.T) {
	path := filepath.Join(t.TempDir(), "etc", "resolv.conf")
	if err := writeResolvConf(path, []string{"10.0.2.3", "1.1.1.1"}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if string(b) != "nameserver 10.0.2.3\nnameserver 1.1.1.1\n" {
		t.Errorf("resolv.conf = %q", b)
	}
}

func TestConsoleLogger(t *testing.T) {
	var buf bytes.Buffer
	log := NewConsoleLogger(&buf, false)
	log.With("disk", "/dev/vda").Info("mounted base", "took", "3ms", "opts", "a b")
	log.Debug("hidden")
	log.Error("failed", "err", "boom")
	want := "isopod-agent: mounted base disk=/dev/vda took=3ms opts=\"a b\"\nisopod-agent: ERROR failed err=boom\n"
	if buf.String() != want {
		t.Errorf("log output:\n%s\nwant:\n%s", buf.String(), want)
	}
}

// A disk found once is found again without a scan: a resumed clone has its
// snapshot VM's disks under the same serials and nodes.
func TestWaitDisksRemembers(t *testing.T) {
	sys, dev := fakeBlock(t, map[string]string{"vda": SerialBase, "vdb": SerialScratch})
	if _, err := waitDisks(sys, dev, []string{SerialBase}, time.Second, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// Scanning now would find nothing.
	if err := os.RemoveAll(sys); err != nil {
		t.Fatal(err)
	}
	found, err := waitDisks(sys, dev, wantedSerials(agentproto.Mount{Scratch: true}), 50*time.Millisecond, time.Millisecond)
	if err != nil || found[SerialScratch] != filepath.Join(dev, "vdb") {
		t.Errorf("found %v, %v; want the scratch disk from the first scan", found, err)
	}
}
