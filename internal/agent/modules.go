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

// loadModules loads every module of the list with finit_module and returns
// how long it took. A module that is already loaded (or built in) is fine;
// other failures are logged and returned together, and loading goes on.
func loadModules(log *slog.Logger, list string) (time.Duration, error) {
	t0 := time.Now()
	mods, err := readModuleList(list)
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, m := range mods {
		if err := loadModule(m); err != nil {
			log.Error("loading kernel module failed", "module", m, "err", err)
			errs = append(errs, err)
		}
	}
	d := time.Since(t0)
	if len(mods) > 0 {
		log.Info("kernel modules loaded", "count", len(mods)-len(errs), "failed", len(errs), "ms", d.Milliseconds())
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
