package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"isopod/internal/errdefs"
)

// send encodes stage id of src and decodes it into a transfer directory
// of dst, returning the decoded file.
func send(t *testing.T, src, dst *Store, id string) string {
	t.Helper()
	var b bytes.Buffer
	if err := src.EncodeLayer(context.Background(), id, &b); err != nil {
		t.Fatal(err)
	}
	dir, release, err := dst.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	p := filepath.Join(dir, "layer")
	if _, err := DecodeLayer(context.Background(), &b, p, 0); err != nil {
		t.Fatal(err)
	}
	return p
}

func receiveReq(m Meta, layer string) ReceiveRequest {
	return ReceiveRequest{Layer: layer, ID: m.ID, Digest: m.Digest, Label: m.Label, Parent: m.Parent,
		BaseFlavor: m.BaseFlavor, BaseSHA256: m.BaseSHA256, Argv: m.Argv, Created: m.Created}
}

func TestReceiveRebuildsTheSameStage(t *testing.T) {
	src, dst := newStore(t), newStore(t)
	t.Cleanup(func() { noTemps(t, dst) }) // after the transfer directories are released
	root := mustCommit(t, src, req(smallLayer(t, 1), "proj/root", ""))
	tip := mustCommit(t, src, req(smallLayer(t, 2), "proj/tip", root.ID))
	if !strings.HasPrefix(tip.Digest, DigestPrefix) || !strings.HasPrefix(strings.TrimPrefix(tip.Digest, DigestPrefix), tip.ID[3:]) {
		t.Fatalf("digest %q does not start with the id %s", tip.Digest, tip.ID)
	}
	ctx := context.Background()
	if _, err := dst.Receive(ctx, receiveReq(tip, send(t, src, dst, tip.ID))); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("receiving a tip before its parent: %v; want a refusal naming the parent", err)
	}
	got, err := dst.Receive(ctx, receiveReq(root, send(t, src, dst, root.ID)))
	if err != nil {
		t.Fatal(err)
	}
	gotTip, err := dst.Receive(ctx, receiveReq(tip, send(t, src, dst, tip.ID)))
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != root.ID || gotTip.ID != tip.ID || gotTip.Digest != tip.Digest || gotTip.Label != "proj/tip" ||
		strings.Join(gotTip.Chain, ",") != root.ID+","+tip.ID || !gotTip.Created.Equal(tip.Created) {
		t.Fatalf("received %+v; want %+v", gotTip, tip)
	}
	a, _ := os.ReadFile(src.LayerPath(tip.ID))
	b, _ := os.ReadFile(dst.LayerPath(tip.ID))
	if !bytes.Equal(a, b) {
		t.Fatal("the received layer differs from the sent one")
	}
	if gotTip.AllocatedBytes >= gotTip.SizeBytes/2 {
		t.Errorf("received layer allocates %d of %d bytes: holes were not kept", gotTip.AllocatedBytes, gotTip.SizeBytes)
	}
	if again, err := dst.Receive(ctx, receiveReq(tip, send(t, src, dst, tip.ID))); err != nil || again.ID != tip.ID {
		t.Fatalf("receiving a present stage again: %+v, %v", again, err)
	}
}

func TestReceiveRefusesBytesThatAreNotTheStage(t *testing.T) {
	src, dst := newStore(t), newStore(t)
	m := mustCommit(t, src, req(smallLayer(t, 3), "proj/x", ""))
	ctx := context.Background()
	r := receiveReq(m, send(t, src, dst, m.ID))
	r.Digest = DigestPrefix + strings.Repeat("0", 64)
	_, err := dst.Receive(ctx, r)
	wantErr(t, err, errdefs.ErrFailedPrecondition, "not the stage")
	r = receiveReq(m, send(t, src, dst, m.ID))
	r.BaseFlavor = "base-debian" // the same bytes over another base are another stage
	_, err = dst.Receive(ctx, r)
	wantErr(t, err, errdefs.ErrFailedPrecondition, "not the stage")

	// A taken label falls back to label@id when asked to.
	mustCommit(t, dst, req(smallLayer(t, 4), "proj/x", ""))
	r = receiveReq(m, send(t, src, dst, m.ID))
	_, err = dst.Receive(ctx, r)
	wantErr(t, err, errdefs.ErrAlreadyExists)
	r = receiveReq(m, send(t, src, dst, m.ID))
	r.LabelFallback = true
	got, err := dst.Receive(ctx, r)
	if err != nil || got.Label != "proj/x@"+m.ID {
		t.Fatalf("fallback label: %+v, %v", got, err)
	}
}

// TestReceiveParentGoneMeanwhile: a parent removed between Receive's first
// look and its decision under the lock is refused, not dropped from the
// chain.
func TestReceiveParentGoneMeanwhile(t *testing.T) {
	r := ReceiveRequest{ID: "st-00000000000000bb", Label: "tip", Parent: "st-00000000000000aa", BaseFlavor: testFlavor}
	_, _, err := newStore(t).receiveMeta(nil, r, 4096, 4096)
	wantErr(t, err, errdefs.ErrNotFound, r.Parent)
}

func TestDecodeLayerRefusesMalformedStreams(t *testing.T) {
	run := func(off, n uint64) []byte {
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:8], off)
		binary.LittleEndian.PutUint64(b[8:], n)
		return b[:]
	}
	size := func(n uint64) []byte { return binary.LittleEndian.AppendUint64(nil, n) }
	block := bytes.Repeat([]byte{7}, blockSize)
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	end := run(sparseEnd, 0)
	for name, stream := range map[string][]byte{
		"magic":      []byte("not a layer"),
		"past size":  cat([]byte(sparseMagic), size(blockSize), run(blockSize, blockSize), block, end),
		"backwards":  cat([]byte(sparseMagic), size(4*blockSize), run(2*blockSize, blockSize), block, run(0, blockSize), block, end),
		"unaligned":  cat([]byte(sparseMagic), size(4*blockSize), run(1, blockSize), block, end),
		"truncated":  cat([]byte(sparseMagic), size(4*blockSize), run(0, blockSize), block[:10]),
		"no end":     cat([]byte(sparseMagic), size(4*blockSize), run(0, blockSize), block),
		"after end":  cat([]byte(sparseMagic), size(4*blockSize), end, []byte("x")),
		"too big":    cat([]byte(sparseMagic), size(uint64(MaxLayerBytes)+blockSize), end),
		"over quota": cat([]byte(sparseMagic), size(4*blockSize), run(0, 2*blockSize), block, block, end),
	} {
		p := filepath.Join(t.TempDir(), "l")
		_, err := DecodeLayer(context.Background(), bytes.NewReader(stream), p, blockSize)
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
