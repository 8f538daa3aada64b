package nvmlsim

import (
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

func TestWriteSysfs(t *testing.T) {
	tests := map[string]struct {
		roots []string
		numa  []int64
	}{
		"dgxh100": {
			roots: []string{"pci0000:15", "pci0000:27", "pci0000:37", "pci0000:5a", "pci0000:97", "pci0000:a8", "pci0000:b7", "pci0000:d8"},
			numa:  []int64{0, 0, 0, 0, 1, 1, 1, 1},
		},
		"dgxa100": {
			roots: []string{"pci0000:00", "pci0000:00", "pci0000:40", "pci0000:40", "pci0000:80", "pci0000:80", "pci0000:a0", "pci0000:a0"},
			numa:  []int64{0, 0, 0, 0, 1, 1, 1, 1},
		},
		"l4x4": {
			roots: []string{"pci0000:00", "pci0000:40", "pci0000:80", "pci0000:c0"},
			numa:  []int64{0, 0, 1, 1},
		},
	}
	for machine, tc := range tests {
		t.Run(machine, func(t *testing.T) {
			m := started(t, machine)
			root := t.TempDir()
			for range 2 { // idempotent
				if err := m.WriteSysfs(root); err != nil {
					t.Fatal(err)
				}
			}
			fs := deviceattribute.WithFSFromRoot(root)
			for i := 0; i < m.GPUCount(); i++ {
				pci := get(device(t, m, i).GetPciInfo()).must(t, "GetPciInfo")
				// NVML's "00000000:18:00.0" -> sysfs "0000:18:00.0"
				bdf := strings.ToLower(cString(pci.BusId[:])[4:])
				rootAttr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(bdf, fs)
				if err != nil {
					t.Fatalf("GPU %d: %v", i, err)
				}
				if got := *rootAttr.Value.StringValue; got != tc.roots[i] {
					t.Errorf("GPU %d PCIe root %s, want %s", i, got, tc.roots[i])
				}
				numa, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(bdf, deviceattribute.ScalarAttribute, fs)
				if err != nil {
					t.Fatalf("GPU %d: %v", i, err)
				}
				if got := *numa.Value.IntValue; got != tc.numa[i] || got != int64(get(device(t, m, i).GetNumaNodeId()).must(t, "GetNumaNodeId")) {
					t.Errorf("GPU %d NUMA node %d, want %d", i, got, tc.numa[i])
				}
				list, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(bdf, deviceattribute.ListAttribute, fs)
				if err != nil || !slices.Equal(list.Value.IntValues, []int64{tc.numa[i]}) {
					t.Errorf("GPU %d NUMA list attribute %v, %v; want [%d] (one node per socket)", i, list.Value.IntValues, err, tc.numa[i])
				}
			}
			node, err := deviceattribute.GetNUMANodeForCPU(1, fs)
			if err != nil || node != 0 {
				t.Errorf("NUMA node of CPU 1: %d, %v", node, err)
			}
		})
	}
}

func TestWriteSysfsMatchesNVML(t *testing.T) {
	for _, machine := range Machines() {
		m := started(t, machine)
		root := t.TempDir()
		if err := m.WriteSysfs(root); err != nil {
			t.Fatal(err)
		}
		fs := deviceattribute.WithFSFromRoot(root)
		for i := 0; i < m.GPUCount(); i++ {
			d := device(t, m, i)
			pci := get(d.GetPciInfo()).must(t, "GetPciInfo")
			bdf := strings.ToLower(cString(pci.BusId[:])[4:])
			numa, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(bdf, deviceattribute.ScalarAttribute, fs)
			if err != nil {
				t.Fatalf("%s GPU %d: %v", machine, i, err)
			}
			if want := get(d.GetNumaNodeId()).must(t, "GetNumaNodeId"); *numa.Value.IntValue != int64(want) {
				t.Errorf("%s GPU %d: sysfs NUMA node %d, NVML %d", machine, i, *numa.Value.IntValue, want)
			}
			if _, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(bdf, fs); err != nil {
				t.Errorf("%s GPU %d: %v", machine, i, err)
			}
		}
		if _, ret := device(t, m, 0).GetTopologyCommonAncestor(device(t, m, m.GPUCount()-1)); ret != nvml.SUCCESS {
			t.Errorf("%s: GetTopologyCommonAncestor: %v", machine, ret)
		}
	}
}
