// Package image produces everything a guest boots from: the pinned Debian
// cloud kernel and the modules the guest needs (fetched with apt, verified
// against a pinned digest), the initramfs holding the static agent at /init,
// the read-only base root images (base-min from a pinned busybox, base-debian
// from debootstrap, others imported from container images), and the sparse
// ext4 scratch template.
//
// Debian's formats are read with pault.ag/go/debian: .deb archives and
// their control files (xz, gzip and zstd members, all decoded in Go), the
// package index stanzas apt-cache prints, dependency fields, and the
// deb822 .sources files that name the host's mirror.
//
// Layout under $ISOPOD_HOME:
//
//	kernels/<version>/vmlinuz          kernel
//	kernels/<version>/modules/...      needed modules, paths relative to /lib/modules/<release>
//	kernels/<version>/modules.order    one relative module path a line, dependencies first
//	kernels/<version>/kernel.json      [KernelInfo]
//	images/initramfs.cpio (+ .json)    for the fetched kernel
//	images/initramfs-builtin.cpio      for a kernel with every driver built in
//	images/base-<flavor>.sqfs (+ .json)
//	images/bases/<content id>/base.sqfs (+ base.json)  imported and pulled bases (bases.go)
//	images/scratch-<MiB>.ext4          scratch template
//
// Every artifact is built in a temporary name next to its destination and
// published by rename while holding a lock under locks/, so a reader never
// sees a half-written file. Builds are reproducible: the same inputs give
// byte-identical images.
package image
