package imexdomain

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// ChannelDevices is the name under which the nvidia module registers the
// IMEX channels' character devices in /proc/devices; channel N is minor N.
const ChannelDevices = "nvidia-caps-imex-channels"

// DefaultProcDevices is the kernel's list of device majors. It is not
// namespaced: a container reads the host's.
const DefaultProcDevices = "/proc/devices"

// maxMinor is the largest minor number Linux encodes (20 bits).
const maxMinor = 1<<20 - 1

// ChannelNodes names the IMEX channels' device nodes by their numbers. The
// driver makes only the channel nodes its module parameters ask for
// (NVreg_CreateImexChannel0 makes channel0), so a container's channel is
// given to the runtime as type, major and minor, and the runtime makes the
// node in the container: nothing is made on the host, the plugin needs no
// CAP_MKNOD or writable driver root, and a containerized driver's root
// (mounted after the plugin starts) makes no difference.
type ChannelNodes struct {
	// ProcDevices is where the majors are read; "" is DefaultProcDevices.
	ProcDevices string
	// StandIn, when non-zero, is the device number every node of a
	// simulated driver root has (nvmlsim.DeviceNodeStandIn): the simulation
	// gives containers no real device's numbers. The major is still read,
	// so a driver without IMEX channels is refused as on a real node.
	StandIn uint64
}

// Device returns channel n's device node for a container. The major is
// read at every call: it is the nvidia module's and may change when the
// module is reloaded.
func (c *ChannelNodes) Device(n int) (cdi.CharDevice, error) {
	if n < 0 || n > maxMinor {
		return cdi.CharDevice{}, fmt.Errorf("IMEX channel %d: not a device minor (0..%d)", n, maxMinor)
	}
	major, err := ChannelMajor(c.procDevices())
	if err != nil {
		return cdi.CharDevice{}, fmt.Errorf("IMEX channel %d: %w", n, err)
	}
	dev := cdi.CharDevice{Path: vocabulary.ChannelDevNode(n), Major: major, Minor: uint32(n)}
	if c.StandIn != 0 {
		dev.Major, dev.Minor = unix.Major(c.StandIn), unix.Minor(c.StandIn)
	}
	return dev, nil
}

func (c *ChannelNodes) procDevices() string {
	if c.ProcDevices == "" {
		return DefaultProcDevices
	}
	return c.ProcDevices
}

// ChannelMajor reads the major of the IMEX channel devices from the
// "Character devices:" section of procDevices (/proc/devices).
func ChannelMajor(procDevices string) (uint32, error) {
	f, err := os.Open(procDevices)
	if err != nil {
		return 0, fmt.Errorf("major of %s: %w", ChannelDevices, err)
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	section := ""
	for line := 1; scanner.Scan(); line++ {
		text := strings.TrimSpace(scanner.Text())
		if strings.HasSuffix(text, ":") {
			section = text
			continue
		}
		fields := strings.Fields(text)
		if section != "Character devices:" || len(fields) != 2 || fields[1] != ChannelDevices {
			continue
		}
		major, err := strconv.ParseUint(fields[0], 10, 32)
		if err != nil || major == 0 {
			return 0, fmt.Errorf("%s line %d: %q: major %q is not a device number", procDevices, line, text, fields[0])
		}
		return uint32(major), nil
	}
	if err := scanner.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", procDevices, err)
	}
	return 0, fmt.Errorf("%s lists no character device %s: the loaded nvidia module has no IMEX channel support "+
		"(load an nvidia module that has it to serve compute domains)", procDevices, ChannelDevices)
}
