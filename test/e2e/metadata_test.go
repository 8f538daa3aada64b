package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// metadataPath is where a container of a pod made by sleeperSpec (pod claim
// "dev", from a template, request "dev") finds its device metadata (KEP-5304,
// k8s.io/dynamic-resource-allocation/api/metadata).
var metadataPath = metadata.ResourceClaimTemplateFilePath(driverName, "dev", "dev")

// TestDeviceMetadataInPod: a pod reads the metadata of the device it got, for
// every kind the default policy publishes (whole GPU, MIG device, time-slice
// share), and finds what the ResourceSlice says of the device's GPU: UUID (a
// MIG device's own, its GPU's as parentUUID), PCI address, NUMA node.
// Passthrough: TestPassthroughLauncher.
func TestDeviceMetadataInPod(t *testing.T) {
	ctx := testContext(t)
	ns := newNamespace(t, ctx, "e2e-metadata")
	for _, tc := range []struct {
		name string
		req  resourceapi.ExactDeviceRequest
	}{
		{"gpu", resourceapi.ExactDeviceRequest{DeviceClassName: driverName}},
		{"mig", resourceapi.ExactDeviceRequest{DeviceClassName: "mig." + driverName,
			Selectors: celSelector(`device.attributes["gpu.dra.dev"].profile == "1g.10gb"`)}},
		{"ts", resourceapi.ExactDeviceRequest{DeviceClassName: "timeslice." + driverName}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claimTemplate(t, ctx, ns, tc.name, tc.req)
			pod := claimPod(t, ctx, ns, tc.name, tc.name)
			claim := podClaim(t, ctx, pod)
			attrs := podMetadata(t, ctx, ns, tc.name, claim)
			published := allocatedDevice(t, ctx, claim)
			wantUUID := stringAttr(published.Attributes[vocabulary.AttrUUID])
			if tc.name == "mig" {
				wantUUID = containerEnv(t, ctx, pod, "NVIDIA_VISIBLE_DEVICES")
				if !strings.HasPrefix(wantUUID, "MIG-") {
					t.Fatalf("NVIDIA_VISIBLE_DEVICES %q, want the MIG device's UUID", wantUUID)
				}
				if got, want := stringAttr(attrs[vocabulary.AttrParentUUID]), stringAttr(published.Attributes[vocabulary.AttrParentUUID]); got == "" || got != want {
					t.Errorf("parentUUID %q, want %q (the ResourceSlice's)", got, want)
				}
			}
			if got := stringAttr(attrs[vocabulary.AttrUUID]); got == "" || got != wantUUID {
				t.Errorf("uuid %q, want %q", got, wantUUID)
			}
			checkGPUPlacement(t, attrs, published)
			deletePod(t, ctx, ns, tc.name)
		})
	}
}

// podMetadata reads the metadata file inside the pod's container and returns
// the attributes of the one device of the claim's request "dev", after
// checking that the file is valid and names the claim's device.
func podMetadata(t *testing.T, ctx context.Context, ns, pod string, claim *resourceapi.ResourceClaim) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	t.Helper()
	out, err := env.cluster.Exec(ctx, ns, pod, "ctr", "cat", metadataPath)
	if err != nil {
		t.Fatalf("read %s in %s/%s: %v: %s", metadataPath, ns, pod, err, out)
	}
	var md metadata.DeviceMetadata
	var invalid error
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(strings.NewReader(out)), &md,
		devicemetadata.DecodeMetadataWithValidationResult(&invalid)); err != nil {
		t.Fatalf("decode %s: %v\n%s", metadataPath, err, out)
	}
	if invalid != nil {
		t.Errorf("metadata %s is not valid: %v", metadataPath, invalid)
	}
	results := claim.Status.Allocation.Devices.Results
	if len(md.Requests) != 1 || md.Requests[0].Name != "dev" || len(md.Requests[0].Devices) != 1 || len(results) != 1 {
		t.Fatalf("metadata %+v, want one device of request dev (allocated %+v)", md, results)
	}
	d := md.Requests[0].Devices[0]
	if d.Driver != driverName || d.Pool != results[0].Pool || d.Name != results[0].Device {
		t.Errorf("metadata names %s/%s/%s, the claim got %s/%s/%s", d.Driver, d.Pool, d.Name, results[0].Driver, results[0].Pool, results[0].Device)
	}
	return d.Attributes
}

// allocatedDevice is the claim's one device as the node's ResourceSlices
// publish it.
func allocatedDevice(t *testing.T, ctx context.Context, claim *resourceapi.ResourceClaim) resourceapi.Device {
	t.Helper()
	r := claim.Status.Allocation.Devices.Results[0]
	for _, s := range nodeSlices(t, ctx, env.node) {
		if s.Spec.Pool.Name != r.Pool {
			continue
		}
		for _, d := range s.Spec.Devices {
			if d.Name == r.Device {
				return d
			}
		}
	}
	t.Fatalf("device %s/%s is not in node %s's ResourceSlices", r.Pool, r.Device, env.node)
	return resourceapi.Device{}
}

// checkGPUPlacement compares the metadata's PCI address and NUMA node with
// the published device's.
func checkGPUPlacement(t *testing.T, attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, published resourceapi.Device) {
	t.Helper()
	if got, want := stringAttr(attrs[vocabulary.AttrPCIBusID]), stringAttr(published.Attributes[vocabulary.AttrPCIBusID]); got == "" || got != want {
		t.Errorf("pciBusID %q, want %q (the ResourceSlice's)", got, want)
	}
	got, want := attrs[vocabulary.AttrNUMANode].IntValue, published.Attributes[vocabulary.AttrNUMANode].IntValue
	if got == nil || want == nil || *got != *want {
		t.Errorf("numaNode %s, want %s (the ResourceSlice's)", intString(got), intString(want))
	}
}

func stringAttr(a resourceapi.DeviceAttribute) string {
	if a.StringValue == nil {
		return ""
	}
	return *a.StringValue
}

func intString(p *int64) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}
