//go:build linux

package doctor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/hosttool"
	"isopod/internal/image"
	"isopod/internal/jail"
	"isopod/internal/paths"
)

// System is the real host, for state root p with the custom kernel and
// agent binary in use (empty: the defaults). VMM and WarmPool come from
// the core; the caller sets them.
func System(p paths.Paths, kernel, agentBin string) Host {
	return Host{
		LookPath: hosttool.Find,
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
		Jail: func(ctx context.Context, qemu string) (JailInfo, error) {
			j, err := jail.New(jail.Config{})
			if err != nil {
				return JailInfo{}, err
			}
			info := JailInfo{UID: j.UID(), GID: j.GID(), Warnings: j.Warnings(), Helper: j.Helper(), PassedOver: j.HelpersPassedOver()}
			if qemu == "" {
				return info, nil
			}
			if err := tryJail(ctx, j, qemu); err != nil {
				return info, err
			}
			info.Tried = true
			return info, nil
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

// tryJail starts `qemu -version` in the jail, as a run starts QEMU: what
// jail.New cannot see (a mount namespace that forbids a fresh /proc, a
// seccomp policy, a cgroup that refuses a process) fails here.
func tryJail(ctx context.Context, j *jail.Jailer, qemu string) error {
	libs, err := jail.Libraries(qemu)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	p, err := j.Command(jail.Spec{
		Name:     fmt.Sprintf("doctor-%d", os.Getpid()),
		Path:     qemu,
		Args:     []string{"-version"},
		Stdout:   &out,
		Stderr:   &out,
		ReadOnly: libs,
		Limits:   jail.Limits{MemoryBytes: 256 << 20, Pids: 16, CPUWeight: 100},
	})
	if err != nil {
		return err
	}
	defer p.Cleanup()
	// The jail's parent-death signal follows the thread that starts it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := p.Cmd.Start(); err != nil {
		return fmt.Errorf("starting %s in the jail: %w", qemu, err)
	}
	kill := func() { syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL) }
	if err := p.Started(); err != nil {
		kill()
		p.Cmd.Wait()
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stop := context.AfterFunc(ctx, kill)
	defer stop()
	if err := p.Cmd.Wait(); err != nil {
		return fmt.Errorf("%s -version in the jail: %w (%s)", qemu, err, strings.TrimSpace(out.String()))
	}
	return nil
}
