package crash

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
)

// BenchmarkPluginRSS reports the resident memory of the plugin process on a
// simulated dgxh100 right after it registered with the kubelet stand-in.
func BenchmarkPluginRSS(b *testing.B) {
	var rss []float64
	for range b.N {
		dirs, err := pluginrun.NewDirs(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dirs.Root, claimsFile), []byte("[]"), 0o644); err != nil {
			b.Fatal(err)
		}
		c := startChild(b, dirs, "")
		kib, err := vmRSSKiB(c.Pid())
		if err != nil {
			b.Fatal(err)
		}
		rss = append(rss, float64(kib)/1024)
		stopChild(b, c)
	}
	var sum float64
	for _, r := range rss {
		sum += r
	}
	b.ReportMetric(sum/float64(len(rss)), "rss-MiB")
}

func vmRSSKiB(pid int) (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}
