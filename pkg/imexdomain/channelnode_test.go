package imexdomain

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// procDevicesWith is /proc/devices with the IMEX channel line given
// (none when "").
func procDevicesWith(imexLine string) string {
	s := "Character devices:\n  1 mem\n195 nvidia\n"
	if imexLine != "" {
		s += imexLine + "\n"
	}
	return s + "235 nvidia-caps\n\nBlock devices:\n  7 loop\n"
}

func writeProcDevices(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "devices")
	if err := os.WriteFile(path, []byte(content), 0o444); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestChannelMajor(t *testing.T) {
	tests := map[string]struct {
		content string
		want    uint32
		wantErr string
	}{
		"present":            {content: procDevicesWith("234 nvidia-caps-imex-channels"), want: 234},
		"missing":            {content: procDevicesWith(""), wantErr: "lists no character device nvidia-caps-imex-channels: the loaded nvidia module has no IMEX channel support"},
		"only a block entry": {content: procDevicesWith("") + "234 nvidia-caps-imex-channels\n", wantErr: "lists no character device"},
		"a longer name":      {content: procDevicesWith("234 nvidia-caps-imex-channels-x"), wantErr: "lists no character device"},
		"malformed major":    {content: procDevicesWith("23x nvidia-caps-imex-channels"), wantErr: `line 4: "23x nvidia-caps-imex-channels": major "23x" is not a device number`},
		"major too large":    {content: procDevicesWith("4294967296 nvidia-caps-imex-channels"), wantErr: "is not a device number"},
		"major 0":            {content: procDevicesWith("0 nvidia-caps-imex-channels"), wantErr: "is not a device number"},
		"empty file":         {content: "", wantErr: "lists no character device"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := writeProcDevices(t, tc.content)
			got, err := ChannelMajor(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), path) {
					t.Fatalf("ChannelMajor = %d, %v; want an error naming %s with %q", got, err, path, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ChannelMajor = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
	if _, err := ChannelMajor(filepath.Join(t.TempDir(), "none")); err == nil || !strings.Contains(err.Error(), "nvidia-caps-imex-channels") {
		t.Errorf("ChannelMajor of a missing file = %v; want an error naming the device", err)
	}
}

// requireMknod skips a test where this process cannot make device nodes.
func requireMknod(t *testing.T) {
	t.Helper()
	probe := filepath.Join(t.TempDir(), "probe")
	if err := unix.Mknod(probe, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Skipf("mknod of a character device in a temporary directory: %v (needs root or CAP_MKNOD)", err)
	}
}

func TestChannelNodesEnsure(t *testing.T) {
	requireMknod(t)
	const major = 234
	node := "/dev/nvidia-caps-imex-channels/channel5"
	tests := map[string]struct {
		procDevices string
		standIn     uint64
		// before prepares the driver root's channel directory.
		before  func(t *testing.T, dir string)
		want    uint64 // the node's device number after
		wantErr string
	}{
		"missing node and directory": {want: unix.Mkdev(major, 5)},
		"missing node, directory left by a crash": {
			before: func(t *testing.T, dir string) { mkdir(t, dir) },
			want:   unix.Mkdev(major, 5),
		},
		"temporary node left by a crash": {
			before: func(t *testing.T, dir string) {
				mkdir(t, dir)
				mknod(t, filepath.Join(dir, ".channel5.1-2"), unix.Mkdev(major, 5))
			},
			want: unix.Mkdev(major, 5),
		},
		"node made by the driver": {
			before: func(t *testing.T, dir string) {
				mkdir(t, dir)
				mknod(t, filepath.Join(dir, "channel5"), unix.Mkdev(major, 5))
			},
			want: unix.Mkdev(major, 5),
		},
		"node with the wrong minor": {
			before: func(t *testing.T, dir string) {
				mkdir(t, dir)
				mknod(t, filepath.Join(dir, "channel5"), unix.Mkdev(major, 6))
			},
			wantErr: "channel5 is character device 234:6, want 234:5",
		},
		"node with the wrong major (module reloaded)": {
			before: func(t *testing.T, dir string) {
				mkdir(t, dir)
				mknod(t, filepath.Join(dir, "channel5"), unix.Mkdev(511, 5))
			},
			wantErr: "channel5 is character device 511:5, want 234:5",
		},
		"a regular file": {
			before: func(t *testing.T, dir string) {
				mkdir(t, dir)
				if err := os.WriteFile(filepath.Join(dir, "channel5"), nil, 0o666); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "channel5 is a regular file, not a character device",
		},
		"a directory": {
			before:  func(t *testing.T, dir string) { mkdir(t, filepath.Join(dir, "channel5")) },
			wantErr: "channel5 is a directory, not a character device",
		},
		"no IMEX channel support": {
			procDevices: procDevicesWith(""),
			wantErr:     "lists no character device nvidia-caps-imex-channels",
		},
		"malformed major": {
			procDevices: procDevicesWith("x nvidia-caps-imex-channels"),
			wantErr:     "is not a device number",
		},
		"simulated driver root's node": {
			standIn: nvmlsim.DeviceNodeStandIn,
			before: func(t *testing.T, dir string) {
				mkdir(t, dir)
				mknod(t, filepath.Join(dir, "channel5"), nvmlsim.DeviceNodeStandIn)
			},
			want: nvmlsim.DeviceNodeStandIn,
		},
		"simulated driver root, missing node": {standIn: nvmlsim.DeviceNodeStandIn, want: nvmlsim.DeviceNodeStandIn},
		"simulated driver root, real numbers": {
			standIn: nvmlsim.DeviceNodeStandIn,
			before: func(t *testing.T, dir string) {
				mkdir(t, dir)
				mknod(t, filepath.Join(dir, "channel5"), unix.Mkdev(major, 5))
			},
			wantErr: "channel5 is character device 234:5, want 1:3",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if tc.procDevices == "" {
				tc.procDevices = procDevicesWith("234 nvidia-caps-imex-channels")
			}
			root := t.TempDir()
			dir := filepath.Join(root, "dev/nvidia-caps-imex-channels")
			if tc.before != nil {
				tc.before(t, dir)
			}
			c := &ChannelNodes{DriverRoot: root, ProcDevices: writeProcDevices(t, tc.procDevices), StandIn: tc.standIn}
			for try := range 2 { // idempotent: the same answer again
				got, err := c.Ensure(5)
				if tc.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "IMEX channel 5") {
						t.Fatalf("try %d: Ensure = %q, %v; want an error with %q", try, got, err, tc.wantErr)
					}
					continue
				}
				if err != nil || got != node {
					t.Fatalf("try %d: Ensure = %q, %v; want %s", try, got, err, node)
				}
				checkCharDev(t, filepath.Join(root, node), tc.want)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, ".channel5.*")); len(left) > 1 {
				t.Errorf("temporary nodes left behind: %v", left)
			}
		})
	}
}

// TestDeviceNodeMakesMissingChannel: the node a prepare asks for is made
// when the driver made only the channels its parameters asked for (before,
// a real node refused the channel).
func TestDeviceNodeMakesMissingChannel(t *testing.T) {
	requireMknod(t)
	root := t.TempDir()
	n := New(Options{DriverRoot: root, ProcDevices: writeProcDevices(t, procDevicesWith("511 nvidia-caps-imex-channels"))})
	node, err := n.DeviceNode(7)
	if err != nil || node != "/dev/nvidia-caps-imex-channels/channel7" {
		t.Fatalf("DeviceNode(7) = %q, %v; want /dev/nvidia-caps-imex-channels/channel7", node, err)
	}
	checkCharDev(t, filepath.Join(root, node), unix.Mkdev(511, 7))
}

func TestChannelNodesNotAMinor(t *testing.T) {
	c := &ChannelNodes{DriverRoot: t.TempDir(), ProcDevices: writeProcDevices(t, procDevicesWith("234 nvidia-caps-imex-channels"))}
	for _, n := range []int{-1, 1 << 20} {
		if node, err := c.Ensure(n); err == nil || !strings.Contains(err.Error(), "not a device minor") {
			t.Errorf("Ensure(%d) = %q, %v; want an error", n, node, err)
		}
	}
}

// TestChannelNodesConcurrent: plugins racing on one node (two ChannelNodes
// stand for two processes) both get the node.
func TestChannelNodesConcurrent(t *testing.T) {
	requireMknod(t)
	root := t.TempDir()
	proc := writeProcDevices(t, procDevicesWith("234 nvidia-caps-imex-channels"))
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			_, err := (&ChannelNodes{DriverRoot: root, ProcDevices: proc}).Ensure(i % 2)
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	checkCharDev(t, filepath.Join(root, "dev/nvidia-caps-imex-channels/channel1"), unix.Mkdev(234, 1))
}

// TestChannelNodesSimulated: a simulated tray's driver root serves the
// channels it has and gets the ones it lacks, with the stand-in numbers.
func TestChannelNodesSimulated(t *testing.T) {
	requireMknod(t)
	m, err := nvmlsim.New("gb200nvl72")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := m.WriteDriverRoot(root); err != nil {
		t.Fatal(err)
	}
	c := &ChannelNodes{DriverRoot: root, ProcDevices: nvmlsim.ProcDevicesFile(root), StandIn: nvmlsim.DeviceNodeStandIn}
	for _, n := range []int{3, m.IMEXChannels() + 10} {
		node, err := c.Ensure(n)
		if err != nil {
			t.Fatalf("channel %d: %v", n, err)
		}
		checkCharDev(t, filepath.Join(root, node), nvmlsim.DeviceNodeStandIn)
	}
	if major, err := ChannelMajor(nvmlsim.ProcDevicesFile(root)); err != nil || major != nvmlsim.IMEXChannelsMajor {
		t.Errorf("simulated major = %d, %v; want %d", major, err, nvmlsim.IMEXChannelsMajor)
	}
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mknod(t *testing.T, path string, dev uint64) {
	t.Helper()
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(dev)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
}

// checkCharDev checks that path is character device dev with mode 0666.
func checkCharDev(t *testing.T, path string, dev uint64) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFCHR || uint64(st.Rdev) != dev || st.Mode&0o777 != 0o666 { //nolint:unconvert
		t.Errorf("%s: mode %#o device %d:%d; want a character device %d:%d with mode 0666", path,
			st.Mode, unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)), unix.Major(dev), unix.Minor(dev)) //nolint:unconvert
	}
}
