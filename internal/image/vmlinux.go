package image

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/ulikunitz/xz"
)

// A bzImage starts by decompressing the kernel it carries, which takes
// hundreds of milliseconds under software emulation. QEMU can instead
// load the uncompressed kernel (an ELF) and jump to its PVH entry point,
// which kernels built with Xen's PVH support (Debian's are) announce in an
// ELF note. So beside the fetched vmlinuz isopod keeps that kernel,
// vmlinux, taken out of the bzImage once, with a record naming the
// vmlinuz it came from; boots use it when the record matches.

// VMLinuxName is the uncompressed kernel's file name beside vmlinuz.
const VMLinuxName = "vmlinux"

// maxVMLinux bounds the uncompressed kernel.
const maxVMLinux = 512 << 20

// xenNotePVHEntry is XEN_ELFNOTE_PHYS32_ENTRY: the PVH entry point.
const xenNotePVHEntry = 18

// vmlinuxRecord is vmlinux.json.
type vmlinuxRecord struct {
	// From is the sha256 of the vmlinuz it was taken from.
	From string `json:"from_sha256"`
}

// errNoPVH: the bzImage holds no kernel isopod can boot directly.
var errNoPVH = errors.New("no PVH kernel in the bzImage")

// extractVMLinux writes the uncompressed kernel of the bzImage at src to
// dir/vmlinux with its record, when the kernel has a PVH entry point and
// is compressed in a format isopod reads (gzip, xz, zstd, lz4); errNoPVH
// otherwise. srcSHA is src's sha256.
func extractVMLinux(src, srcSHA, dir string) error {
	bz, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	payload, err := bzPayload(bz)
	if err != nil {
		return err
	}
	elfBytes, err := decompressKernel(payload)
	if err != nil {
		return err
	}
	if !hasPVHEntry(elfBytes) {
		return errNoPVH
	}
	if err := writeFileAtomic(filepath.Join(dir, VMLinuxName), elfBytes, 0o644); err != nil {
		return err
	}
	return writeJSONAtomic(filepath.Join(dir, VMLinuxName+".json"), vmlinuxRecord{From: srcSHA})
}

// bzPayload returns the compressed kernel of a bzImage (boot protocol
// 2.08 and later: payload_offset and payload_length in the setup header).
func bzPayload(bz []byte) ([]byte, error) {
	if len(bz) < 0x250 || string(bz[0x202:0x206]) != "HdrS" {
		return nil, fmt.Errorf("not a bzImage: %w", errNoPVH)
	}
	setupSects := int(bz[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	start := (setupSects + 1) * 512
	off := int(binary.LittleEndian.Uint32(bz[0x248:]))
	n := int(binary.LittleEndian.Uint32(bz[0x24c:]))
	if start+off+n > len(bz) || n < 4 {
		return nil, fmt.Errorf("bzImage payload out of range: %w", errNoPVH)
	}
	return bz[start+off : start+off+n], nil
}

// decompressKernel decompresses a payload by its magic.
func decompressKernel(p []byte) ([]byte, error) {
	var r io.Reader
	var err error
	switch {
	case bytes.HasPrefix(p, []byte{0x1f, 0x8b}):
		r, err = gzip.NewReader(bytes.NewReader(p))
	case bytes.HasPrefix(p, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		r, err = xz.NewReader(bytes.NewReader(p))
	case bytes.HasPrefix(p, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		var d *zstd.Decoder
		d, err = zstd.NewReader(bytes.NewReader(p))
		if err == nil {
			defer d.Close()
			r = d
		}
	case bytes.HasPrefix(p, []byte{0x02, 0x21, 0x4c, 0x18}):
		return lz4Legacy(p[4:])
	default:
		return nil, fmt.Errorf("kernel compressed in a format isopod does not read: %w", errNoPVH)
	}
	if err != nil {
		return nil, fmt.Errorf("decompressing the kernel: %w", err)
	}
	out, err := io.ReadAll(io.LimitReader(r, maxVMLinux+1))
	if err != nil && !(errors.Is(err, io.ErrUnexpectedEOF) && len(out) > 0) {
		return nil, fmt.Errorf("decompressing the kernel: %w", err)
	}
	if len(out) > maxVMLinux {
		return nil, fmt.Errorf("the kernel is over %d bytes uncompressed: %w", maxVMLinux, errNoPVH)
	}
	return out, nil
}

// lz4Legacy decompresses the lz4 "legacy" frame the kernel's build uses:
// after the magic, blocks of at most 8 MiB, each preceded by its
// compressed size; the payload ends with the uncompressed size, which is
// not a block.
func lz4Legacy(p []byte) ([]byte, error) {
	const maxBlock = 8 << 20
	var out []byte
	buf := make([]byte, maxBlock)
	for len(p) >= 4 {
		n := int(binary.LittleEndian.Uint32(p))
		if n == 0 || n > len(p)-4 || n > lz4.CompressBlockBound(maxBlock) {
			break // the trailing size, or the end
		}
		m, err := lz4.UncompressBlock(p[4:4+n], buf)
		if err != nil {
			return nil, fmt.Errorf("decompressing the kernel (lz4): %w", err)
		}
		if out = append(out, buf[:m]...); len(out) > maxVMLinux {
			return nil, fmt.Errorf("the kernel is over %d bytes uncompressed: %w", maxVMLinux, errNoPVH)
		}
		p = p[4+n:]
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty lz4 kernel: %w", errNoPVH)
	}
	return out, nil
}

// hasPVHEntry reports whether an ELF kernel announces a PVH entry point.
func hasPVHEntry(b []byte) bool {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil || f.Machine != elf.EM_X86_64 {
		return false
	}
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_NOTE {
			continue
		}
		data, err := io.ReadAll(prog.Open())
		if err != nil {
			continue
		}
		if notesHave(data, "Xen", xenNotePVHEntry, f.ByteOrder) {
			return true
		}
	}
	return false
}

// notesHave walks an ELF note segment for a note of name and type.
func notesHave(data []byte, name string, typ uint32, bo binary.ByteOrder) bool {
	align := func(n uint32) uint32 { return (n + 3) &^ 3 }
	for len(data) >= 12 {
		nsz, dsz, t := bo.Uint32(data), bo.Uint32(data[4:]), bo.Uint32(data[8:])
		rest := data[12:]
		if uint64(align(nsz))+uint64(align(dsz)) > uint64(len(rest)) {
			return false
		}
		n := string(bytes.TrimRight(rest[:nsz], "\x00"))
		if n == name && t == typ {
			return true
		}
		data = rest[align(nsz)+align(dsz):]
	}
	return false
}

// tryVMLinux extracts the uncompressed kernel beside a vmlinuz that has
// none yet; a kernel without one boots from its bzImage.
func tryVMLinux(vmlinuz, sha, dir string, log *slog.Logger) {
	if bootKernel(vmlinuz, sha) != vmlinuz {
		return
	}
	start := time.Now()
	err := extractVMLinux(vmlinuz, sha, dir)
	switch {
	case errors.Is(err, errNoPVH):
		log.Info("the kernel boots from its bzImage", "why", err)
	case err != nil:
		log.Warn("taking the uncompressed kernel out of the bzImage failed; it boots from the bzImage", "err", err)
	default:
		log.Info("uncompressed kernel extracted for a direct boot", "elapsed", time.Since(start).Round(time.Millisecond))
	}
}

// bootKernel is the kernel a boot uses for the vmlinuz at path with the
// given sha256: vmlinux beside it when its record says it was taken from
// that vmlinuz, else the vmlinuz itself.
func bootKernel(path, sha string) string {
	dir := filepath.Dir(path)
	var rec vmlinuxRecord
	if readJSON(filepath.Join(dir, VMLinuxName+".json"), &rec) != nil || rec.From != sha {
		return path
	}
	v := filepath.Join(dir, VMLinuxName)
	if _, err := os.Stat(v); err != nil {
		return path
	}
	return v
}
