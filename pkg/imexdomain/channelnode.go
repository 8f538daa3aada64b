package imexdomain

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// ChannelDevices is the name under which the nvidia module registers the
// IMEX channels' character devices in /proc/devices; channel N is minor N.
const ChannelDevices = "nvidia-caps-imex-channels"

// DefaultProcDevices is the kernel's list of device majors. It is not
// namespaced: a container reads the host's.
const DefaultProcDevices = "/proc/devices"

// channelNodeMode is the mode of a channel node the plugin makes, the
// driver's default (NVreg_DeviceFileMode) and NVIDIA's plugin's: any user
// of a container that was given the channel may open it.
const channelNodeMode = 0o666

// maxMinor is the largest minor number Linux encodes (20 bits).
const maxMinor = 1<<20 - 1

// ChannelNodes makes and checks the IMEX channels' device nodes below a
// driver root. The driver makes only the channels its module parameters
// ask for (NVreg_CreateImexChannel0 makes channel0), so the node
// of a channel a domain was given is made on demand, with the major the
// nvidia module registered and the channel as minor.
type ChannelNodes struct {
	// DriverRoot is where the plugin sees the driver's /dev.
	DriverRoot string
	// ProcDevices is where the majors are read; "" is DefaultProcDevices.
	ProcDevices string
	// StandIn, when non-zero, is the device number every node of a
	// simulated driver root has (nvmlsim.DeviceNodeStandIn): the
	// simulation gives containers no real device's numbers, so a node is
	// made with it and checked against it. The major is still read.
	StandIn uint64

	// mu serializes this process's makes; another process making the
	// same node meets EEXIST at the link and checks what it finds.
	mu sync.Mutex
}

// Ensure returns channel n's device node (its path in a container, below
// the driver root on the host), making it when it is missing. An existing
// node must be a character device with the channel's numbers.
func (c *ChannelNodes) Ensure(n int) (string, error) {
	node := vocabulary.ChannelDevNode(n)
	if n < 0 || n > maxMinor {
		return "", fmt.Errorf("IMEX channel %d: not a device minor (0..%d)", n, maxMinor)
	}
	major, err := ChannelMajor(c.procDevices())
	if err != nil {
		return "", fmt.Errorf("IMEX channel %d: %w", n, err)
	}
	want := unix.Mkdev(major, uint32(n))
	if c.StandIn != 0 {
		want = c.StandIn
	}
	path := filepath.Join(c.DriverRoot, node)
	c.mu.Lock()
	defer c.mu.Unlock()
	err = checkNode(path, want)
	if errors.Is(err, fs.ErrNotExist) {
		err = makeNode(path, want)
	}
	if err != nil {
		return "", fmt.Errorf("IMEX channel %d: %w", n, err)
	}
	return node, nil
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

// checkNode checks that path is a character device numbered want; a
// missing path is fs.ErrNotExist.
func checkNode(path string, want uint64) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	got := uint64(st.Rdev) //nolint:unconvert // Rdev is uint32 on some architectures.
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return fmt.Errorf("%s is a %s, not a character device", path, typeName(st.Mode))
	}
	if got != want {
		return fmt.Errorf("%s is character device %d:%d, want %d:%d", path,
			unix.Major(got), unix.Minor(got), unix.Major(want), unix.Minor(want))
	}
	return nil
}

// typeName names a stat mode's file type for an error.
func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFIFO:
		return "named pipe"
	case unix.S_IFSOCK:
		return "socket"
	}
	return fmt.Sprintf("file of type %#o", mode&unix.S_IFMT)
}

// makeNode makes path a character device numbered want with mode 0666. It
// is made under a temporary name, given its mode (mknod applies the umask)
// and linked into place, so path is never a node with the wrong mode. A
// node another process linked first is checked instead. A crash between
// mknod and link leaves the temporary node, named by nothing and with the
// channel's own numbers and mode; /dev is emptied at boot.
func makeNode(path string, want uint64) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("make the IMEX channel directory: %w", err)
	}
	tmp := filepath.Join(dir, fmt.Sprintf(".%s.%d-%d", filepath.Base(path), os.Getpid(), rand.Uint64()))
	if err := unix.Mknod(tmp, unix.S_IFCHR|channelNodeMode, int(want)); err != nil {
		return fmt.Errorf("make %s (character device %d:%d): mknod: %w (the plugin needs CAP_MKNOD and a writable %s)",
			path, unix.Major(want), unix.Minor(want), err, dir)
	}
	defer os.Remove(tmp)
	if err := os.Chmod(tmp, channelNodeMode); err != nil {
		return err
	}
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("make %s: %w", path, err)
	}
	return checkNode(path, want)
}
