package sharing

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The MPS server and its clients share POSIX shared memory (CUDA keeps
// cuda.shm.* files in /dev/shm), so with daemons in pods of their own
// (MPSOptions.ShmSize > 0) each device gets a tmpfs, <device dir>/shm, that
// the daemon and every client container mount at /dev/shm, as NVIDIA's
// drivers do. The plugin mounts it on the host: its data dir must be
// mounted with Bidirectional propagation.

// containerShmDir is where the daemon and the clients see the device's tmpfs.
const containerShmDir = "/dev/shm"

// ensureShm mounts the device's tmpfs unless it is mounted already (by an
// earlier plugin instance, for a daemon still running). The tmpfs of a dead
// daemon is emptied like its pipe directory.
func (m *MPSManager) ensureShm(p devicePaths) error {
	if m.opts.ShmSize <= 0 {
		return nil
	}
	if err := os.MkdirAll(p.shm, 0o755); err != nil {
		return fmt.Errorf("create MPS shared memory directory: %w", err)
	}
	mounted, err := isTmpfsMount(p.shm)
	if err != nil {
		return err
	}
	if mounted {
		return emptyDir(p.shm)
	}
	opts := fmt.Sprintf("size=%d,mode=1777", m.opts.ShmSize)
	if err := unix.Mount("tmpfs", p.shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mount tmpfs (%s) on %s for the MPS daemon and its clients' /dev/shm: %w", opts, p.shm, err)
	}
	return nil
}

// removeShm unmounts the device's tmpfs and removes its directory; missing
// is fine.
func removeShm(p devicePaths) error {
	mounted, err := isTmpfsMount(p.shm)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if mounted {
		// Detach: a client container that is still being torn down may
		// hold it; the memory goes with the last user.
		if err := unix.Unmount(p.shm, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount MPS shared memory %s: %w", p.shm, err)
		}
	}
	if err := os.RemoveAll(p.shm); err != nil {
		return fmt.Errorf("remove MPS shared memory directory: %w", err)
	}
	return nil
}

// isTmpfsMount reports whether dir is the root of a tmpfs mount: a tmpfs
// on another device than its parent.
func isTmpfsMount(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, &fs.PathError{Op: "statfs", Path: dir, Err: err}
	}
	if st.Type != unix.TMPFS_MAGIC {
		return false, nil
	}
	var self, parent unix.Stat_t
	if err := unix.Stat(dir, &self); err != nil {
		return false, &fs.PathError{Op: "stat", Path: dir, Err: err}
	}
	if err := unix.Stat(filepath.Dir(dir), &parent); err != nil {
		return false, &fs.PathError{Op: "stat", Path: filepath.Dir(dir), Err: err}
	}
	return self.Dev != parent.Dev, nil
}
