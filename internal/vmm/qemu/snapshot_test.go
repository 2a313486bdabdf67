package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/errdefs"
	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmtest"
)

func fileDigest(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// generationID is the machine's vmgenid GUID.
func generationID(t *testing.T, m *Machine) string {
	t.Helper()
	ret, err := m.QMP().Execute(context.Background(), "query-vm-generation-id", nil)
	if err != nil {
		t.Fatalf("query-vm-generation-id: %v", err)
	}
	var id struct {
		GUID string `json:"guid"`
	}
	if err := json.Unmarshal(ret, &id); err != nil || id.GUID == "" {
		t.Fatalf("query-vm-generation-id: %s (%v)", ret, err)
	}
	return id.GUID
}

func TestSnapshotRestore(t *testing.T) {
	d := newTestDriver(t)
	g := vmmtest.BuildGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cfg := vmmtest.Config(t, g)
	builder := vmmtest.Boot(t, d, cfg)
	// Every QEMU process gets its own VM generation ID, clones included.
	guids := map[string]string{"builder": generationID(t, builder.M.(*Machine))}
	snap := t.TempDir()
	start := time.Now()
	if err := builder.M.(vmm.Snapshotter).Snapshot(ctx, snap); err != nil {
		t.Fatalf("Snapshot: %v\n%s", err, builder.Serial.Tail(2000))
	}
	t.Logf("snapshot took %v", time.Since(start).Round(time.Millisecond))
	builder.M.Kill()
	builder.M.Wait()
	for _, f := range []string{snapMeta, snapState, snapMemory} {
		st, err := os.Stat(filepath.Join(snap, f))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d bytes", f, st.Size())
	}
	memSum := fileDigest(t, filepath.Join(snap, snapMemory))

	for i, name := range []string{"first", "second"} {
		rc := vmmtest.Config(t, g)
		rc.ID += name
		serial := &vmmtest.SyncBuffer{}
		rc.SerialLog = serial
		began := time.Now()
		m, err := d.Restore(ctx, rc, snap)
		if err != nil {
			t.Fatalf("Restore %d: %v", i, err)
		}
		restoreTook := time.Since(began)
		resumed := time.Since(m.(*Machine).Started())
		t.Cleanup(func() { m.Kill(); m.Wait(); m.Agent().Close() })
		guid := generationID(t, m.(*Machine))
		for who, g := range guids {
			if g == guid {
				t.Errorf("restored guest %s has the generation ID of %s (%s)", name, who, g)
			}
		}
		guids[name] = guid
		// The guest was waiting on its port; it answers the host's Hello
		// on the new channel.
		hctx, hcancel := context.WithTimeout(ctx, 30*time.Second)
		_, err = agentclient.New(m.Agent(), nil).Hello(hctx)
		hcancel()
		if err != nil {
			t.Fatalf("restored guest %s did not answer: %v; console:\n%s", name, err, serial.Tail(2000))
		}
		t.Logf("restore %s: Restore call %v, qemu start to running %v, qemu start to first agent reply %v (accel %s)",
			name, restoreTook.Round(time.Millisecond), resumed.Round(time.Millisecond),
			time.Since(m.(*Machine).Started()).Round(time.Millisecond), m.Accel())
	}
	if fileDigest(t, filepath.Join(snap, snapMemory)) != memSum {
		t.Error("restored guests changed the shared snapshot memory file")
	}

	bad := vmmtest.Config(t, g)
	bad.MemMiB = 512
	if _, err := d.Restore(ctx, bad, snap); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Restore with another memory size: %v; want ErrInvalidArgument", err)
	}
	vmmtest.AssertNoProcess(t, bad.ID)

	// Files changed after the snapshot was taken are refused before QEMU
	// runs: the state by its digest, the memory by size and mtime.
	for i, f := range []string{snapState, snapMemory} {
		path := filepath.Join(snap, f)
		orig, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := os.Stat(path)
		flip := append([]byte(nil), orig...)
		flip[len(flip)/2] ^= 1
		if err := os.WriteFile(path, flip, 0o644); err != nil {
			t.Fatal(err)
		}
		if f == snapState {
			// Only the content: the digest must catch it.
			os.Chtimes(path, st.ModTime(), st.ModTime())
		}
		rc := vmmtest.Config(t, g)
		rc.ID += "tampered" + strconv.Itoa(i)
		if _, err := d.Restore(ctx, rc, snap); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("Restore with a modified %s: %v; want ErrFailedPrecondition", f, err)
		}
		vmmtest.AssertNoProcess(t, rc.ID)
		if err := os.WriteFile(path, orig, 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(path, st.ModTime(), st.ModTime())
	}
	again := vmmtest.Config(t, g)
	again.ID += "again"
	m, err := d.Restore(ctx, again, snap)
	if err != nil {
		t.Fatalf("Restore of the repaired snapshot: %v", err)
	}
	m.Kill()
	m.Wait()
	m.Agent().Close()

	// A snapshot of another machine format is refused before QEMU runs.
	metaPath := filepath.Join(snap, snapMeta)
	b, err := os.ReadFile(metaPath)
	if err != nil {
		t.Fatal(err)
	}
	var meta map[string]any
	if err := json.Unmarshal(b, &meta); err != nil {
		t.Fatal(err)
	}
	meta["machine"] = machineFormat - 1
	b, _ = json.Marshal(meta)
	if err := os.WriteFile(metaPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	old := vmmtest.Config(t, g)
	old.ID += "old"
	if _, err := d.Restore(ctx, old, snap); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Restore of an older machine format: %v; want ErrFailedPrecondition", err)
	}
	vmmtest.AssertNoProcess(t, old.ID)
}
