package kueue

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// built says whether hack/kueue/build.sh finished dir: bin/kueue and
// config/.done exist.
func built(dir string) bool {
	if fi, err := os.Stat(filepath.Join(dir, "bin", "kueue")); err != nil || fi.Mode()&0o111 == 0 {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, "config", ".done"))
	return err == nil
}

// building says whether a hack/kueue/build.sh holds dir's lock.
func building(dir string) bool {
	f, err := os.Open(filepath.Join(dir, ".lock"))
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// WaitBuilt waits until hack/kueue/build.sh has built dir. make demo and
// make e2e start that build in the background, so that the cluster's first
// parts do not wait for Kueue; the parts that run Kueue wait here. A build
// that ends without the files fails the wait, quoting the end of buildLog.
func WaitBuilt(ctx context.Context, dir, buildLog string, logf func(string, ...any)) error {
	start, idle := time.Now(), 0
	for last := time.Now(); !built(dir); {
		if building(dir) {
			idle = 0
		} else if idle++; idle > 10 { // not started yet, or ended without the files
			tail := ""
			if data, err := os.ReadFile(buildLog); err == nil {
				lines := strings.Split(strings.TrimSpace(string(data)), "\n")
				tail = strings.Join(lines[max(0, len(lines)-15):], "\n")
			}
			return fmt.Errorf("kueue is not built in %s and no build runs (hack/kueue/build.sh; log %s):\n%s", dir, buildLog, tail)
		}
		if time.Since(last) > time.Minute {
			logf("waiting for the Kueue build in the background (%s so far; log %s)", time.Since(start).Round(time.Second), buildLog)
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the Kueue build (log %s): %w", buildLog, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	if d := time.Since(start); d > time.Second {
		logf("Kueue built in the background; waited %s for it", d.Round(time.Second))
	}
	return nil
}
