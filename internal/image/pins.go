package image

// Pin names one Debian package at one version and the sha256 of its .deb.
type Pin struct {
	Package string `json:"package"`
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
}

// KernelPin is the guest kernel: Debian bookworm's cloud kernel.
var KernelPin = Pin{
	Package: "linux-image-6.1.0-50-cloud-amd64",
	Version: "6.1.176-1",
	SHA256:  "efe19f605b6f54a8352e68d85a629abb2d30b72a085faef603a9152590baa791",
}

// KernelMetaPackage depends on the newest cloud kernel; --allow-unpinned
// follows it.
const KernelMetaPackage = "linux-image-cloud-amd64"

// BusyboxPin is the busybox that base-min is made of.
var BusyboxPin = Pin{
	Package: "busybox-static",
	Version: "1:1.35.0-4+deb12u1+b1",
	SHA256:  "3d3fdbe91d4660c873e14b092c213fe81c1da6362daa236eb25d0171eb108744",
}

// GuestModules are the modules the guest needs when the kernel builds them
// as modules; their dependencies are added. A name the kernel has built in
// is skipped.
var GuestModules = []string{
	"virtio", "virtio_ring", "virtio_mmio",
	"virtio_blk", "virtio_console", "virtio_net",
	"vsock", "vmw_vsock_virtio_transport_common", "vmw_vsock_virtio_transport",
	"squashfs", "overlay",
}

// DebianSuite is the release base-debian is bootstrapped from.
const DebianSuite = "bookworm"

// DebianPackages are installed into base-debian on top of minbase.
var DebianPackages = []string{
	"python3", "python3-pip", "python3-venv", "nodejs", "npm", "git",
	"gcc", "libc6-dev", "make", "curl", "ca-certificates",
}
