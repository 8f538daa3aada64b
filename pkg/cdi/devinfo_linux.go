package cdi

import (
	"errors"
	"io/fs"
	"syscall"

	"golang.org/x/sys/unix"
)

// deviceInfo returns the type and numbers of a device file.
func deviceInfo(fi fs.FileInfo) (devInfo, error) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return devInfo{}, errors.New("no device numbers available")
	}
	var t string
	switch fi.Mode().Type() {
	case fs.ModeDevice | fs.ModeCharDevice:
		t = "c"
	case fs.ModeDevice:
		t = "b"
	default:
		return devInfo{}, errors.New("not a device node")
	}
	rdev := uint64(st.Rdev) //nolint:unconvert // Rdev is uint32 on some architectures.
	return devInfo{
		devType: t,
		major:   int64(unix.Major(rdev)),
		minor:   int64(unix.Minor(rdev)),
		perm:    fi.Mode().Perm(),
	}, nil
}

// volatileFS reports whether dir is on a file system that a reboot erases
// (tmpfs, ramfs), where fsyncs reach no disk.
func volatileFS(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, err
	}
	return st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC, nil
}
