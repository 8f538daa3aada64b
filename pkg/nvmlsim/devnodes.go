package nvmlsim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// WithholdDeviceNodes keeps the device nodes whose names below dev/ ("nvidia-uvm",
// "nvidia-caps/nvidia-cap12") withhold matches out of the machine's driver roots: they are removed
// from the roots written so far and not made again, as on a fresh node where nvidia-uvm loads, or a
// MIG capability node is made, only after the kubelet plugin started. nil makes them all again, as
// nvidia-modprobe does when it loads the module. The choice is not kept in the state file.
func (m *Machine) WithholdDeviceNodes(withhold func(name string) bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.withheldNodes = withhold
	for _, root := range m.driverRoots {
		if err := m.makeDeviceNodes(root); err != nil {
			return fmt.Errorf("device nodes under %s: %w", root, err)
		}
		if err := m.syncDriverRoot(root); err != nil {
			return fmt.Errorf("device nodes under %s: %w", root, err)
		}
	}
	return nil
}

// makeDeviceNodes makes the device nodes that do not depend on MIG state: the control nodes, the
// MIG config and monitor capabilities, one node per GPU and, on multi-node NVLink trays, the IMEX
// channels. m.mu must be held.
func (m *Machine) makeDeviceNodes(root string) error {
	nodes := map[string]os.FileMode{
		"nvidiactl":               0o666,
		"nvidia-uvm":              0o666,
		"nvidia-uvm-tools":        0o666,
		"nvidia-caps/nvidia-cap1": 0o400, // mig/config: root only, like the driver's default
		"nvidia-caps/nvidia-cap2": 0o444, // mig/monitor
	}
	for _, g := range m.gpus {
		nodes[fmt.Sprintf("nvidia%d", g.index)] = 0o666
	}
	for i := range m.imexChannelsLocked() {
		nodes[IMEXChannelNode(i)] = 0o666
	}
	for name, mode := range nodes {
		if err := m.makeDeviceNode(root, name, mode); err != nil {
			return err
		}
	}
	return nil
}

// makeDeviceNode makes root's dev/<name>, or removes it while it is withheld. m.mu must be held.
func (m *Machine) makeDeviceNode(root, name string, mode os.FileMode) error {
	path := filepath.Join(root, "dev", name)
	if m.withheldNodes != nil && m.withheldNodes(name) {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	return makeDeviceNode(path, mode)
}

// IMEXChannelNode is IMEX channel i's device node below dev/, as the driver's
// nvidia-caps-imex-channels device makes them: "nvidia-caps-imex-channels/channel<i>".
func IMEXChannelNode(i int) string {
	return fmt.Sprintf("nvidia-caps-imex-channels/channel%d", i)
}

// IMEXChannels returns how many IMEX channels the machine's driver root has: 0 on machines
// without a multi-node NVLink fabric, unless SetIMEXChannels made some.
func (m *Machine) IMEXChannels() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.imexChannelsLocked()
}

func (m *Machine) imexChannelsLocked() int { return max(m.spec.nvlink.imexChannels, m.imexChannels) }

// SetIMEXChannels makes the driver roots written so far, and later ones, have IMEX channels 0 to
// n-1, as the nvidia module makes them when its parameters ask for channels: on a machine whose
// GPUs have an NVLink fabric but which makes no channels of its own (a DGX H100's GPUs are in a
// clique of their own) the fault campaign prepares compute domain channels so. A count below the
// machine's own changes nothing, and no node is removed. The count is not kept in the state file.
func (m *Machine) SetIMEXChannels(n int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.imexChannels = n
	for _, root := range m.driverRoots {
		if err := m.makeDeviceNodes(root); err != nil {
			return fmt.Errorf("device nodes under %s: %w", root, err)
		}
	}
	return nil
}
