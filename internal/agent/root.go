package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
)

// The run's root is assembled when the host sends Mount, not at boot: the
// guest boots with only its base image mounted, so that a snapshot taken
// then serves any chain of layers, scratch disk and workspace attached at
// restore.

// blkflsbuf is BLKFLSBUF, _IO(0x12, 97): flush a block device's buffers.
const blkflsbuf = 0x1261

// defaultDiskWait bounds the wait for a Mount's disks when the host gives
// none.
const defaultDiskWait = 30 * time.Second

// mounted is what a Mount set up.
type mounted struct {
	scratchFD int // a directory on the scratch filesystem, to freeze; -1
	// workspace is the guest directory of the workspace overlay, its
	// writable layer's upper directory, its original tree, and whether
	// the mount point had to be made in the root.
	workspace      string
	workspaceUpper string
	workspaceLower string
	madeMountPoint bool
}

// mountRoot assembles the run's root from the disks m names and switches to
// it. It may run once.
func mountRoot(log *slog.Logger, m agentproto.Mount) (mounted, error) {
	mt := mounted{scratchFD: -1}
	if m.Layers < 0 || m.Layers > MaxLayers {
		return mt, fmt.Errorf("mount: %d layers; the guest mounts 0 to %d", m.Layers, MaxLayers)
	}
	if m.Workspace != "" && (!filepath.IsAbs(m.Workspace) || filepath.Clean(m.Workspace) != m.Workspace || m.Workspace == "/") {
		return mt, fmt.Errorf("mount: workspace %q must be a clean absolute directory other than /", m.Workspace)
	}
	wait := time.Duration(m.WaitMS) * time.Millisecond
	if wait <= 0 {
		wait = defaultDiskWait
	}
	t0 := time.Now()
	found, err := waitDisks("/sys/block", "/dev", wantedSerials(m), wait, diskPoll)
	if err != nil {
		return mt, err
	}
	tFound := time.Now()
	if m.Flush {
		for _, s := range wantedSerials(m) {
			if err := flushDisk(found[s]); err != nil {
				return mt, err
			}
		}
	}
	lower, err := mountLayers(found, m.Layers)
	if err != nil {
		return mt, err
	}
	if mt.scratchFD, err = mountUpper(found, m.Scratch); err != nil {
		return mt, err
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", lower, scratchDir, scratchDir)
	if err := mountAt("overlay", newRootDir, "overlay", 0, opts); err != nil {
		return mt, err
	}
	tMounted := time.Now()
	if m.Prefetch > 0 {
		dirs := strings.Split(lower, ":")
		n := prefetchTree(dirs[:len(dirs)-1], newRootDir, min(m.Prefetch, agentproto.MaxPrefetch))
		log.Info("stage tree prefetched", "entries", n, "ms", time.Since(tMounted).Milliseconds())
	}
	tPrefetched := time.Now()
	if err := switchRoot(newRootDir); err != nil {
		return mt, err
	}
	if err := finishRoot(); err != nil {
		log.Warn("preparing the root", "err", err)
	}
	tSwitched := time.Now()
	if m.Workspace != "" {
		if err := mountWorkspace(found, m.Workspace, &mt); err != nil {
			return mt, err
		}
	}
	log.Info("root assembled", "layers", m.Layers, "scratch", m.Scratch, "workspace", m.Workspace, "ms", time.Since(t0).Milliseconds(),
		"find_ms", tFound.Sub(t0).Milliseconds(), "mount_ms", tMounted.Sub(tFound).Milliseconds(), "switch_ms", tSwitched.Sub(tPrefetched).Milliseconds())
	return mt, nil
}

// flushDisk drops the cached sectors of the block device dev.
func flushDisk(dev string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("mount: opening %s: %w", dev, err)
	}
	defer unix.Close(fd)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), blkflsbuf, 0); errno != 0 {
		return fmt.Errorf("mount: flushing %s: %w", dev, errno)
	}
	return nil
}

// mountLayers mounts the n stage layers read-only and returns overlayfs's
// lowerdir value over the base.
func mountLayers(found map[string]string, n int) (string, error) {
	devs, err := layerDevices(found, n)
	if err != nil {
		return "", err
	}
	var mounts []string
	for i, dev := range devs {
		target := filepath.Join(layersDir, strconv.Itoa(i))
		if err := mountAt(dev, target, "ext4", unix.MS_RDONLY|unix.MS_NOATIME, ""); err != nil {
			return "", fmt.Errorf("stage layer %d: %w", i, err)
		}
		mounts = append(mounts, target)
	}
	lower, _ := lowerDirs(mounts, baseMount)
	return lower, nil
}

// mountUpper mounts the scratch disk (or a tmpfs) as the root's writable
// layer and returns a descriptor of it for freezing (-1 for a tmpfs).
func mountUpper(found map[string]string, scratch bool) (int, error) {
	if scratch {
		if err := mountAt(found[SerialScratch], scratchDir, "ext4", unix.MS_NOATIME, ""); err != nil {
			return -1, fmt.Errorf("scratch disk: %w", err)
		}
	} else if err := mountAt("tmpfs", scratchDir, "tmpfs", unix.MS_NOATIME, "mode=0755"); err != nil {
		return -1, err
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.MkdirAll(filepath.Join(scratchDir, d), 0o755); err != nil {
			return -1, fmt.Errorf("scratch: %w", err)
		}
	}
	if !scratch {
		return -1, nil
	}
	fd, err := unix.Open(scratchDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("scratch: %w", err)
	}
	return fd, nil
}

// mountWorkspace mounts the workspace's original tree (squashfs) and its
// writable layer (ext4) under /run/isopod/workspace, and their overlay at
// dir, in the run's root (after the switch). Its mount point is made if the
// root lacks it, and removed again before a commit (see unmountWorkspace).
func mountWorkspace(found map[string]string, dir string, mt *mounted) error {
	lowerDir := filepath.Join(agentproto.WorkspaceMountPoint, "tree")
	rwDir := filepath.Join(agentproto.WorkspaceMountPoint, "rw")
	if err := mountAt(found[agentproto.SerialWorkspace], lowerDir, "squashfs", unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	if err := mountAt(found[agentproto.SerialWorkspaceUpper], rwDir, "ext4", unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("workspace: writable layer: %w", err)
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.MkdirAll(filepath.Join(rwDir, d), 0o755); err != nil {
			return fmt.Errorf("workspace: %w", err)
		}
	}
	target := dir
	if _, err := os.Lstat(target); errors.Is(err, os.ErrNotExist) {
		mt.madeMountPoint = true
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", lowerDir, rwDir, rwDir)
	if err := mountAt("overlay", target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	mt.workspace, mt.workspaceUpper, mt.workspaceLower = dir, rwDir+"/upper", lowerDir
	return nil
}

// unmountWorkspace takes the workspace out of the root before a commit, so
// that the mount point it needed is not part of the committed layer.
func (mt *mounted) unmountWorkspace() error {
	if mt.workspace == "" {
		return nil
	}
	if err := unix.Unmount(mt.workspace, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting the workspace: %w", err)
	}
	if mt.madeMountPoint {
		if err := os.Remove(mt.workspace); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing the workspace mount point: %w", err)
		}
	}
	mt.workspace = ""
	return nil
}
