package warmpool

import "strings"

// Judging a snapshot against the key a run of its shape has now (which
// the core computes): stale (a listing says why a run would not use it)
// or dead (`isopod vm gc` removes it).

// Stale says why a run whose current key is cur would not use m ("" when
// it would): a stage layer of an assembled snapshot is gone, or a part of
// the key changed since the build.
func (m *Meta) Stale(cur Key) string {
	if m.Parts.Assembled {
		if why := m.LayerGone(); why != "" {
			return why
		}
		cur = cur.WithRoot(m.Parts.Layers, m.Parts.ScratchMiB)
	}
	if d := cur.Diff(m.Parts); len(d) > 0 {
		return "changed since the build: " + strings.Join(d, ", ")
	}
	return ""
}

// Dead says why m can never be used again ("" when it may be), its base
// build being there: its format or protocol is not format and protocol,
// a stage layer of an assembled snapshot is gone, or, against the current
// key (cur; none when it cannot be computed), the host kernel or CPU
// changed, or the fetched guest kernel or its initramfs was rebuilt.
// Parts that follow one call's settings (ISOPOD_ACCEL, ISOPOD_KERNEL,
// ISOPOD_QEMU) never make a snapshot dead.
func (m *Meta) Dead(format, protocol int, cur func() (Key, error)) string {
	switch {
	case m.Parts.Protocol != protocol || m.Parts.Format != format:
		return "format or protocol changed"
	case m.Parts.Assembled && m.LayerGone() != "":
		return m.LayerGone()
	}
	k, err := cur()
	if err != nil {
		return ""
	}
	fetched := strings.HasPrefix(m.Parts.GuestKernel, "sha256:") && strings.HasPrefix(k.GuestKernel, "sha256:")
	for _, d := range k.Diff(m.Parts) {
		if d == "host kernel" || d == "cpu model" || (fetched && (d == "initramfs" || d == "guest kernel")) {
			return d + " changed"
		}
	}
	return ""
}
