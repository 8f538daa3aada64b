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
