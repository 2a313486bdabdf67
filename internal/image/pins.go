package image

// Pin names one Debian package at one version and the sha256 of its .deb.
type Pin struct {
	Package string `json:"package"`
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
	// Filename is the .deb's path in a Debian mirror, for a package taken
	// from a suite the host's apt does not serve; empty: apt downloads it.
	Filename string `json:"filename,omitempty"`
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

// BusyboxPin is the busybox that base-min is made of: Debian trixie's
// static build, fetched from a Debian mirror's pool (see fetchFromPool).
// bookworm's 1:1.35.0-4+deb12u1+b1 crashed in `wget -T`.
var BusyboxPin = Pin{
	Package:  "busybox-static",
	Version:  "1:1.37.0-6+b9",
	SHA256:   "598a3fd92bdafc34cd81196b2952ad36e910e47a4ecf162f8ce5e8e262598e53",
	Filename: "pool/main/b/busybox/busybox-static_1.37.0-6+b9_amd64.deb",
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
