package mig

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// newMachine returns simulated machine name with NVML initialized.
func newMachine(t *testing.T, name string, opts ...nvmlsim.Option) *nvmlsim.Machine {
	t.Helper()
	m, err := nvmlsim.New(name, opts...)
	if err != nil {
		t.Fatalf("nvmlsim.New(%q): %v", name, err)
	}
	if ret := m.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	t.Cleanup(func() { m.Shutdown() })
	return m
}

// device returns the handle of GPU index.
func device(t *testing.T, m *nvmlsim.Machine, index int) nvml.Device {
	t.Helper()
	dev, ret := m.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex(%d): %v", index, ret)
	}
	return dev
}

// testContext returns a context whose logger writes to t at the most verbose level.
func testContext(t *testing.T) context.Context {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	return ctx
}

// migMode returns dev's current MIG mode.
func migMode(t *testing.T, dev nvml.Device) int {
	t.Helper()
	current, _, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		t.Fatalf("GetMigMode: %v", ret)
	}
	return current
}

// layout renders the simulation's view of GPU index's instances: "GI 2 9@4:4 [CI 0 2@0:3 MIG-...]".
func layout(m *nvmlsim.Machine, index int) string {
	var parts []string
	for _, gi := range m.GpuInstances(index) {
		s := fmt.Sprintf("GI %d %d@%d:%d", gi.ID, gi.ProfileID, gi.Start, gi.Size)
		var cis []string
		for _, ci := range gi.ComputeInstances {
			cis = append(cis, fmt.Sprintf("CI %d %d@%d:%d %s", ci.ID, ci.ProfileID, ci.Start, ci.Size, ci.UUID))
		}
		parts = append(parts, s+" ["+strings.Join(cis, ", ")+"]")
	}
	return strings.Join(parts, "; ")
}

// enableMIGMode turns MIG mode on directly through NVML.
func enableMIGMode(t *testing.T, dev nvml.Device) {
	t.Helper()
	if status, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS || status != nvml.SUCCESS {
		t.Fatalf("SetMigMode(enable): %v, %v", status, ret)
	}
}

// createGI creates a GPU instance directly through NVML, as a crashed Create or an administrator
// would leave it.
func createGI(t *testing.T, dev nvml.Device, profileID uint32, pl Placement) nvml.GpuInstance {
	t.Helper()
	for index := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(index)
		if ret != nvml.SUCCESS || info.Id != profileID {
			continue
		}
		gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: pl.Start, Size: pl.Size})
		if ret != nvml.SUCCESS {
			t.Fatalf("CreateGpuInstanceWithPlacement(%d, %v): %v", profileID, pl, ret)
		}
		return gi
	}
	t.Fatalf("no GPU instance profile with ID %d", profileID)
	return nil
}

// createCI creates a compute instance of compute-instance profile index in gi directly.
func createCI(t *testing.T, gi nvml.GpuInstance, index int) nvml.ComputeInstance {
	t.Helper()
	info, ret := gi.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetComputeInstanceProfileInfo(%d): %v", index, ret)
	}
	ci, ret := gi.CreateComputeInstance(&info)
	if ret != nvml.SUCCESS {
		t.Fatalf("CreateComputeInstance(%d): %v", index, ret)
	}
	return ci
}

// fakeDevice overrides some methods of a simulated GPU to reproduce situations the simulation
// does not: running processes, and an A100 whose MIG mode change waits for a reset.
type fakeDevice struct {
	nvml.Device
	processes []nvml.ProcessInfo
	// noReset makes SetMigMode only change the pending mode, as when the driver cannot reset.
	noReset bool
	current int
	pending int
}

func (f *fakeDevice) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	if f.processes != nil {
		return f.processes, nvml.SUCCESS
	}
	return f.Device.GetComputeRunningProcesses()
}

func (f *fakeDevice) GetMigMode() (int, int, nvml.Return) {
	if f.noReset {
		return f.current, f.pending, nvml.SUCCESS
	}
	return f.Device.GetMigMode()
}

func (f *fakeDevice) SetMigMode(mode int) (nvml.Return, nvml.Return) {
	if f.noReset {
		f.pending = mode
		return nvml.SUCCESS, nvml.SUCCESS
	}
	return f.Device.SetMigMode(mode)
}
