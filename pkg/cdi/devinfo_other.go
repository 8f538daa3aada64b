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
