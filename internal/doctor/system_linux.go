//go:build linux

package doctor

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"

	"isopod/internal/image"
	"isopod/internal/jail"
	"isopod/internal/paths"
)

// System is the real host, for state root p with the custom kernel and
// agent binary in use (empty: the defaults). KVMProbe and WarmPool come
// from the core; the caller sets them.
func System(p paths.Paths, kernel, agentBin string) Host {
	return Host{
		LookPath: exec.LookPath,
		QEMUVersion: func(ctx context.Context, bin string) (string, error) {
			out, err := exec.CommandContext(ctx, bin, "-version").Output()
			return string(out), err
		},
		OpenKVM: func() error {
			f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
			if err != nil {
				return err
			}
			return f.Close()
		},
		Jail: func() (JailInfo, error) {
			j, err := jail.New(jail.Config{})
			if err != nil {
				return JailInfo{}, err
			}
			return JailInfo{UID: j.UID(), GID: j.GID(), Warnings: j.Warnings()}, nil
		},
		Kernel: func() (image.BootKernel, error) { return image.ResolveKernel(p, kernel) },
		Images: func() ([]image.ImageInfo, error) { return image.ListImages(p, kernel, agentBin) },
		Agent:  func() (string, error) { return image.LocateAgent(agentBin) },
		FreeBytes: func(dir string) (uint64, string, error) {
			for {
				var st unix.Statfs_t
				err := unix.Statfs(dir, &st)
				if err == nil {
					return st.Bavail * uint64(st.Bsize), dir, nil
				}
				parent := filepath.Dir(dir)
				if !errors.Is(err, fs.ErrNotExist) || parent == dir {
					return 0, dir, err
				}
				dir = parent
			}
		},
	}
}
