//go:build !linux

package cdi

import (
	"errors"
	"io/fs"
)

// deviceInfo is only implemented on Linux.
func deviceInfo(fs.FileInfo) (devInfo, error) {
	return devInfo{}, errors.New("device nodes are only supported on Linux")
}

// volatileFS is only known on Linux: elsewhere every spec is fsynced.
func volatileFS(string) (bool, error) { return false, nil }
