package imexdomain

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
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

func TestChannelNodesDevice(t *testing.T) {
	proc := writeProcDevices(t, procDevicesWith("511 nvidia-caps-imex-channels"))
	tests := map[string]struct {
		nodes   ChannelNodes
		channel int
		want    cdi.CharDevice
		wantErr string
	}{
		"real numbers": {nodes: ChannelNodes{ProcDevices: proc}, channel: 7,
			want: cdi.CharDevice{Path: "/dev/nvidia-caps-imex-channels/channel7", Major: 511, Minor: 7}},
		"largest minor": {nodes: ChannelNodes{ProcDevices: proc}, channel: 1<<20 - 1,
			want: cdi.CharDevice{Path: "/dev/nvidia-caps-imex-channels/channel1048575", Major: 511, Minor: 1<<20 - 1}},
		"stand-in": {nodes: ChannelNodes{ProcDevices: proc, StandIn: unix.Mkdev(1, 3)}, channel: 7,
			want: cdi.CharDevice{Path: "/dev/nvidia-caps-imex-channels/channel7", Major: 1, Minor: 3}},
		"negative":   {nodes: ChannelNodes{ProcDevices: proc}, channel: -1, wantErr: "IMEX channel -1: not a device minor"},
		"too large":  {nodes: ChannelNodes{ProcDevices: proc}, channel: 1 << 20, wantErr: "not a device minor"},
		"no support": {nodes: ChannelNodes{ProcDevices: writeProcDevices(t, procDevicesWith(""))}, channel: 0, wantErr: "IMEX channel 0: "},
		// A simulated driver without channels is refused too: the
		// stand-in replaces the numbers, not the driver's support.
		"stand-in, no support": {nodes: ChannelNodes{ProcDevices: writeProcDevices(t, procDevicesWith("")), StandIn: unix.Mkdev(1, 3)},
			channel: 0, wantErr: "has no IMEX channel support"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := tc.nodes.Device(tc.channel)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Device(%d) = %+v, %v; want an error with %q", tc.channel, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Device(%d) = %+v, %v; want %+v", tc.channel, got, err, tc.want)
			}
		})
	}
}

// TestChannelNodesSimulated: a simulated tray's driver root lists the
// channels' major, and its channels get the stand-in numbers, beyond the
// nodes the simulated driver made too.
func TestChannelNodesSimulated(t *testing.T) {
	m, err := nvmlsim.New("gb200nvl72")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := m.WriteDriverRoot(root); err != nil {
		t.Fatal(err)
	}
	n := New(Options{ProcDevices: nvmlsim.ProcDevicesFile(root), ChannelStandIn: nvmlsim.DeviceNodeStandIn})
	for _, c := range []int{3, m.IMEXChannels() + 10} {
		dev, err := n.DeviceNode(c)
		if err != nil {
			t.Fatalf("channel %d: %v", c, err)
		}
		if unix.Mkdev(dev.Major, dev.Minor) != nvmlsim.DeviceNodeStandIn || dev.Path != vocabulary.ChannelDevNode(c) {
			t.Errorf("channel %d = %+v; want %s with the stand-in numbers", c, dev, vocabulary.ChannelDevNode(c))
		}
	}
	if major, err := ChannelMajor(nvmlsim.ProcDevicesFile(root)); err != nil || major != nvmlsim.IMEXChannelsMajor {
		t.Errorf("simulated major = %d, %v; want %d", major, err, nvmlsim.IMEXChannelsMajor)
	}
}
