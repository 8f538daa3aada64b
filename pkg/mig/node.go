package mig

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/klog/v2"
)

// Node reaches the MIG devices of a node's GPUs by GPU UUID, for the prepare
// path: it creates and destroys the instance a claim was allocated, knowing
// only what the claim's record holds (profile and placement), turns MIG mode
// off for whole-GPU use and lists a MIG device's capability nodes.
type Node struct {
	lib        nvml.Interface
	driverRoot string
}

// NewNode returns a Node over lib; driverRoot is the host path of the
// NVIDIA driver installation (for the MIG capability minors).
func NewNode(lib nvml.Interface, driverRoot string) *Node {
	return &Node{lib: lib, driverRoot: driverRoot}
}

// Create makes the MIG device of profile profileID at placement on the GPU
// (see Create). record is called once the GPU is reached and before
// anything is created, so that the caller can durably record its intent; if
// record fails, nothing is created and its error is returned as is.
func (n *Node) Create(ctx context.Context, gpuUUID string, profileID uint32, placement Placement, record func() error) (*Instance, error) {
	dev, err := n.device(gpuUUID)
	if err != nil {
		return nil, err
	}
	if err := record(); err != nil {
		return nil, err
	}
	return Create(ctx, dev, profileID, placement)
}

// Destroy removes the GPU instance of profile profileID at placement, with
// its compute instance; one that does not exist counts as destroyed.
func (n *Node) Destroy(ctx context.Context, gpuUUID string, profileID uint32, placement Placement) error {
	dev, err := n.device(gpuUUID)
	if err != nil {
		return err
	}
	inst, err := Find(dev, profileID, placement)
	if err != nil {
		return err
	}
	if inst == nil {
		return nil
	}
	ciID := inst.CIID
	if !inst.Complete() && len(inst.ComputeInstances) > 0 {
		ciID = inst.ComputeInstances[0].ID
	}
	klog.FromContext(ctx).V(4).Info("Destroying MIG instance", "gpu", gpuUUID, "gi", inst.GIID, "ci", ciID)
	return Destroy(ctx, dev, inst.GIID, ciID)
}

// EnsureOff takes a GPU in MIG mode out of it when it has no instances left,
// so it can be used whole or shared. A GPU whose MIG mode is not on (or that
// has no MIG) is left alone, a pending change included.
func (n *Node) EnsureOff(ctx context.Context, gpuUUID string) error {
	dev, err := n.device(gpuUUID)
	if err != nil {
		return err
	}
	current, _, ret := dev.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED || (ret == nvml.SUCCESS && current != nvml.DEVICE_MIG_ENABLE) {
		return nil
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("get MIG mode of %s: %w", gpuUUID, ret)
	}
	if _, err := DisableIfUnused(ctx, dev); err != nil {
		return fmt.Errorf("turn off MIG mode: %w", err)
	}
	return nil
}

// CapDeviceNodes returns the capability nodes of a MIG device (see
// CapDeviceNodes) under the Node's driver root.
func (n *Node) CapDeviceNodes(gpuMinor int, giID, ciID uint32) ([]string, error) {
	return CapDeviceNodes(n.driverRoot, gpuMinor, giID, ciID)
}

func (n *Node) device(uuid string) (nvml.Device, error) {
	dev, ret := n.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("get GPU %s: %w", uuid, ret)
	}
	return dev, nil
}
