package storetest

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/store"
)

// Send encodes stage id of src as a layer stream and decodes it into a
// transfer directory of dst, as a pull does; it returns the decoded file.
func Send(t *testing.T, src, dst store.Interface, id string) string {
	t.Helper()
	var b bytes.Buffer
	if err := src.EncodeLayer(t.Context(), id, &b); err != nil {
		t.Fatalf("EncodeLayer(%s): %v", id, err)
	}
	dir, release, err := dst.TempDir()
	if err != nil {
		t.Fatalf("TempDir: %v", err)
	}
	t.Cleanup(release)
	p := filepath.Join(dir, "layer")
	if _, err := store.DecodeLayer(t.Context(), &b, p, 0); err != nil {
		t.Fatalf("DecodeLayer: %v", err)
	}
	return p
}

// ReceiveReq is the request that receives m, sent as layer.
func ReceiveReq(m store.Meta, layer string) store.ReceiveRequest {
	return store.ReceiveRequest{Layer: layer, ID: m.ID, Digest: m.Digest, Label: m.Label, Parent: m.Parent,
		BaseFlavor: m.BaseFlavor, BaseSHA256: m.BaseSHA256, Argv: m.Argv, Created: m.Created,
		IsopodVersion: m.IsopodVersion}
}

// testReceive checks that a chain sent from one store to another arrives
// as the same stages: ids, digests, labels, chains, bytes; and that a
// stage already present is returned as it is.
func testReceive(t *testing.T, tg Target) {
	src, dst := tg.New(t), tg.New(t)
	root := MustCommit(t, src, Req(Layer(t, 1), "proj/root", ""))
	tip := MustCommit(t, src, Req(Layer(t, 2), "proj/tip", root.ID))
	for _, m := range []store.Meta{root, tip} {
		req := ReceiveReq(m, Send(t, src, dst, m.ID))
		req.Blob = store.BlobRecord{Digest: "sha256:" + hexOf(m.ID), Size: 42, MediaType: "application/test"}
		got, err := dst.Receive(t.Context(), req)
		if err != nil {
			t.Fatalf("Receive(%s): %v", m.Label, err)
		}
		if got.ID != m.ID || got.Digest != m.Digest || got.Label != m.Label || got.Parent != m.Parent ||
			!slices.Equal(got.Chain, m.Chain) || !got.Created.Equal(m.Created) || got.SizeBytes != m.SizeBytes {
			t.Errorf("received\n %+v\nsent\n %+v", got, m)
		}
		if have, err := dst.Get(m.ID); err != nil {
			t.Errorf("Get(%s) after Receive: %v", m.ID, err)
		} else {
			sameMeta(t, "Get after Receive", have, got)
		}
		if !bytes.Equal(readFile(t, dst.LayerPath(m.ID)), readFile(t, src.LayerPath(m.ID))) {
			t.Errorf("the received layer of %s differs from the sent one", m.Label)
		}
		if r, ok := dst.BlobRecord(m.ID); !ok || r != req.Blob {
			t.Errorf("BlobRecord after Receive = %+v, %v; want %+v", r, ok, req.Blob)
		}
		if d, err := dst.LayerDigest(t.Context(), got); err != nil || d != m.Digest {
			t.Errorf("LayerDigest = %s, %v; want %s", d, err, m.Digest)
		}
	}
	again, err := dst.Receive(t.Context(), ReceiveReq(tip, Send(t, src, dst, tip.ID)))
	if err != nil || again.ID != tip.ID {
		t.Errorf("receiving a present stage again = %s, %v; want it as it is", again.ID, err)
	}
	if l := listIDs(t, dst); !slices.Equal(l, []string{root.ID, tip.ID}) {
		t.Errorf("List = %v; want %v", l, []string{root.ID, tip.ID})
	}
}

// testReceiveRefusals checks what Receive refuses: bytes that are not the
// stage they claim to be, a missing parent, a taken label (unless a
// fallback is asked for).
func testReceiveRefusals(t *testing.T, tg Target) {
	src, dst := tg.New(t), tg.New(t)
	root := MustCommit(t, src, Req(Layer(t, 1), "proj/root", ""))
	tip := MustCommit(t, src, Req(Layer(t, 2), "proj/tip", root.ID))

	_, err := dst.Receive(t.Context(), ReceiveReq(tip, Send(t, src, dst, tip.ID)))
	wantErr(t, "Receive before the parent", err, errdefs.ErrNotFound)

	bad := Send(t, src, dst, root.ID)
	f, err := os.OpenFile(bad, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt([]byte("tampered"), 100)
	if cerr := f.Close(); err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
	_, err = dst.Receive(t.Context(), ReceiveReq(root, bad))
	wantErr(t, "Receive of bytes that are not the stage", err, errdefs.ErrFailedPrecondition)
	wrongDigest := ReceiveReq(root, Send(t, src, dst, root.ID))
	wrongDigest.Digest = store.DigestPrefix + hexOf(root.ID) + "00"
	_, err = dst.Receive(t.Context(), wrongDigest)
	wantErr(t, "Receive under a wrong digest", err, errdefs.ErrFailedPrecondition)
	if l := listIDs(t, dst); len(l) != 0 {
		t.Fatalf("List = %v after refused receives; want nothing", l)
	}

	testReceiveOtherFlavor(t, src, dst, root)

	MustCommit(t, dst, Req(Layer(t, 3), root.Label, ""))
	_, err = dst.Receive(t.Context(), ReceiveReq(root, Send(t, src, dst, root.ID)))
	wantErr(t, "Receive under a taken label", err, errdefs.ErrAlreadyExists)
	req := ReceiveReq(root, Send(t, src, dst, root.ID))
	req.LabelFallback = true
	m, err := dst.Receive(t.Context(), req)
	if want := root.Label + "@" + root.ID; err != nil || m.Label != want {
		t.Errorf("Receive with a label fallback = %q, %v; want %q", m.Label, err, want)
	}
}

// testReceiveOtherFlavor checks that a received stage keeps its parent's
// base flavor, as a committed one must: root is in src, and dst lacks it.
func testReceiveOtherFlavor(t *testing.T, src, dst store.Interface, root store.Meta) {
	t.Helper()
	if _, err := dst.Receive(t.Context(), ReceiveReq(root, Send(t, src, dst, root.ID))); err != nil {
		t.Fatalf("Receive(%s): %v", root.Label, err)
	}
	dir, release, err := dst.TempDir()
	if err != nil {
		t.Fatalf("TempDir: %v", err)
	}
	defer release()
	layer := filepath.Join(dir, "layer")
	if err := os.Rename(Layer(t, 4), layer); err != nil {
		t.Fatal(err)
	}
	id, digest, _, err := store.HashLayer(t.Context(), layer, root.ID, "base-debian")
	if err != nil {
		t.Fatal(err)
	}
	_, err = dst.Receive(t.Context(), store.ReceiveRequest{Layer: layer, ID: id, Digest: digest, Label: "mixed",
		Parent: root.ID, BaseFlavor: "base-debian", BaseSHA256: SHA})
	wantErr(t, "Receive over a parent of another base flavor", err, errdefs.ErrInvalidArgument)
	if _, err := dst.Remove(t.Context(), root.ID); err != nil {
		t.Fatalf("Remove(%s): %v", root.Label, err)
	}
}

// testBlobRecords checks that a blob record is kept per stage.
func testBlobRecords(t *testing.T, s store.Interface) {
	a := MustCommit(t, s, Req(Layer(t, 1), "a", ""))
	b := MustCommit(t, s, Req(Layer(t, 2), "b", ""))
	if r, ok := s.BlobRecord(a.ID); ok {
		t.Errorf("BlobRecord of a new stage = %+v; want none", r)
	}
	rec := store.BlobRecord{Digest: "sha256:" + hexOf(a.ID), Size: 1234, MediaType: "application/test"}
	if err := s.SetBlobRecord(a.ID, rec); err != nil {
		t.Fatalf("SetBlobRecord: %v", err)
	}
	if r, ok := s.BlobRecord(a.ID); !ok || r != rec {
		t.Errorf("BlobRecord = %+v, %v; want %+v", r, ok, rec)
	}
	if r, ok := s.BlobRecord(b.ID); ok {
		t.Errorf("BlobRecord of another stage = %+v; want none", r)
	}
	if d, err := s.LayerDigest(t.Context(), a); err != nil || d != a.Digest {
		t.Errorf("LayerDigest = %s, %v; want %s", d, err, a.Digest)
	}
}
