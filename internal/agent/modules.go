package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ModulesList names the kernel modules to load at boot, one path per line
// in load order (dependencies first). A missing or empty list means a
// kernel with everything built in.
const ModulesList = "/etc/isopod/modules"

// readModuleList returns the module paths of a list; blank lines and lines
// starting with '#' are skipped. A missing list is an empty one.
func readModuleList(path string) ([]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the module list: %w", err)
	}
	defer f.Close()
	var mods []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		mods = append(mods, l)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the module list %s: %w", path, err)
	}
	return mods, nil
}

// deviceModules are the modules that drive one kind of virtio device,
// by the virtio device id they need (1 a NIC, 19 a vsock): a machine
// without such a device does not load them. Loading a module costs tens of
// milliseconds under emulation.
var deviceModules = map[string]string{
	"failover": "0x0001", "net_failover": "0x0001", "virtio_net": "0x0001",
	"vsock": "0x0013", "vmw_vsock_virtio_transport_common": "0x0013", "vmw_vsock_virtio_transport": "0x0013",
}

// moduleName is a module's name from its path: kernel/net/core/failover.ko
// is failover.
func moduleName(path string) string {
	n := path[strings.LastIndexByte(path, '/')+1:]
	if i := strings.Index(n, ".ko"); i >= 0 {
		n = n[:i]
	}
	return strings.ReplaceAll(n, "-", "_")
}

// virtioDevices lists the virtio device ids of the machine (read once the
// virtio transport is loaded and has probed them).
func virtioDevices(sysBus string) map[string]bool {
	ids := map[string]bool{}
	ents, _ := os.ReadDir(sysBus)
	for _, e := range ents {
		b, err := os.ReadFile(sysBus + "/" + e.Name() + "/device")
		if err == nil {
			ids[strings.TrimSpace(string(b))] = true
		}
	}
	return ids
}

// loadModules loads the modules of the list with finit_module, but those
// of devices the machine lacks, and returns how long it took. A module
// that is already loaded (or built in) is fine; other failures are logged
// and returned together, and loading goes on.
func loadModules(log *slog.Logger, list string) (time.Duration, error) {
	t0 := time.Now()
	mods, err := readModuleList(list)
	if err != nil {
		return 0, err
	}
	var (
		errs    []error
		devices map[string]bool // read at the first device module
		skipped int
	)
	for _, m := range mods {
		if id, ok := deviceModules[moduleName(m)]; ok {
			if devices == nil {
				devices = virtioDevices("/sys/bus/virtio/devices")
			}
			if !devices[id] {
				skipped++
				continue
			}
		}
		if err := loadModule(m); err != nil {
			log.Error("loading kernel module failed", "module", m, "err", err)
			errs = append(errs, err)
		}
	}
	d := time.Since(t0)
	if len(mods) > 0 {
		log.Info("kernel modules loaded", "count", len(mods)-len(errs)-skipped, "failed", len(errs), "skipped", skipped, "ms", d.Milliseconds())
	}
	return d, errors.Join(errs...)
}

func loadModule(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("module %s: %w", path, err)
	}
	defer unix.Close(fd)
	flags := 0
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		if strings.HasSuffix(path, ext) {
			flags |= unix.MODULE_INIT_COMPRESSED_FILE
		}
	}
	if err := unix.FinitModule(fd, "", flags); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("module %s: finit_module: %w", path, err)
	}
	return nil
}
