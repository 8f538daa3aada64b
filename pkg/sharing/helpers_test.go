package sharing

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/klog/v2/ktesting"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// testContext returns a context whose logger writes to the test log.
func testContext(t *testing.T) context.Context {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	return ctx
}

// newSim returns an initialized simulated machine.
func newSim(t *testing.T, machine string) *nvmlsim.Machine {
	t.Helper()
	m, err := nvmlsim.New(machine, nvmlsim.WithSeed(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	if ret := m.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	t.Cleanup(func() { m.Shutdown() })
	return m
}

// NewSimSlicer returns the simulation's TimeSlicer
// (simhooks.NewTimeSlicer). sim_test.go sets it: this package's own tests
// cannot import simhooks, which imports this package.
var NewSimSlicer func(*nvmlsim.Machine) TimeSlicer

// gpuRef is the DeviceRef of the simulated GPU with the given index.
func gpuRef(m *nvmlsim.Machine, index int) DeviceRef {
	return DeviceRef{UUID: m.GPUUUID(index), Index: index}
}

// migRef is a DeviceRef of a MIG device on the simulated GPU index.
func migRef(m *nvmlsim.Machine, index int) DeviceRef {
	return DeviceRef{UUID: "MIG-9a7c1c4e-7d2b-5f37-a1b0-0c5a3e2f6d1" + string(rune('0'+index)), ParentUUID: m.GPUUUID(index), Index: index}
}

func computeModeOf(t *testing.T, m *nvmlsim.Machine, index int) nvml.ComputeMode {
	t.Helper()
	dev, ret := m.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex(%d): %v", index, ret)
	}
	mode, ret := dev.GetComputeMode()
	if ret != nvml.SUCCESS {
		t.Fatalf("GetComputeMode(%d): %v", index, ret)
	}
	return mode
}

func setComputeModeOf(t *testing.T, m *nvmlsim.Machine, index int, mode nvml.ComputeMode) {
	t.Helper()
	dev, ret := m.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex(%d): %v", index, ret)
	}
	if ret := dev.SetComputeMode(mode); ret != nvml.SUCCESS {
		t.Fatalf("SetComputeMode(%d): %v", index, ret)
	}
}

func interval(i gpuv1beta1.TimeSliceInterval) *gpuv1beta1.TimeSlicingConfig {
	return &gpuv1beta1.TimeSlicingConfig{Interval: &i}
}

// dirEntries lists the names in dir.
func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// writeScript writes an executable shell script.
func writeScript(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
}
