package node

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	resourceapi "k8s.io/api/resource/v1"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
)

// With --device-metadata the kubelet plugin helper gives each prepared device's containers its
// metadata file (KEP-5304), and the file names the device's UUID (a MIG device's own), PCI
// address and NUMA node.
// A passthrough device's file names its VFIO group device too, and the
// containers get that device.
func TestDeviceMetadataFile(t *testing.T) {
	ctx := context.Background()
	// Passthrough devices are published only by the device policy.
	policyFile := filepath.Join(t.TempDir(), "device-policy.yaml")
	if err := os.WriteFile(policyFile, []byte("default: {passthrough: true}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	policy, err := devicemodel.LoadPolicy(policyFile)
	if err != nil {
		t.Fatal(err)
	}
	dirs, node, claims := allocateClaims(t, driverName, &policy,
		at.Claim("whole", at.Exactly("gpu", driverName, 1)),
		at.Claim("mig", at.Exactly("mig", "mig."+driverName, 1, at.Profile("1g.10gb"))),
		at.Claim("ts", at.Exactly("ts", "timeslice."+driverName, 1)),
		at.Claim("vm", at.Exactly("vm", "vfio."+driverName, 1)))
	names := []string{"whole", "mig", "ts", "vm"}
	cfg := dirs.Config(machine, nodeName)
	cfg.DeviceMetadata = true
	cfg.DevicePolicyFile = policyFile
	var all []*resourceapi.ResourceClaim
	for _, name := range names {
		all = append(all, claims[name])
	}
	cfg.KubeClient = apiserver.NodeClient(nodeName, all...)
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()

	for _, name := range names {
		claim := claims[name]
		ids, err := p.Kubelet.PrepareOne(ctx, claim)
		if err != nil {
			t.Fatal(err)
		}
		spec := inject(t, dirs.CDI, ids)
		request := claim.Status.Allocation.Devices.Results[0].Request
		want := "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/" + name + "/" + request + "/" + driverName + "-metadata.json"
		i := slices.IndexFunc(spec.Mounts, func(m oci.Mount) bool { return m.Destination == want })
		if i < 0 {
			var dests []string
			for _, m := range spec.Mounts {
				if strings.Contains(m.Destination, "dra-device-attributes") {
					dests = append(dests, m.Destination)
				}
			}
			t.Fatalf("%s: no mount at %s; metadata mounts %v", name, want, dests)
		}
		attrs := readMetadata(t, spec.Mounts[i].Source)
		device := at.Devices(claim)[0]
		gi := slices.IndexFunc(node.GPUs, func(g discovery.GPU) bool {
			return device == g.CanonicalName() || strings.HasPrefix(device, g.CanonicalName()+"-")
		})
		if gi < 0 {
			t.Fatalf("%s: device %s of no GPU", name, device)
		}
		g := node.GPUs[gi]
		if got := attrs["resource.kubernetes.io/pciBusID"].StringValue; got == nil || *got != g.PCIBusID {
			t.Errorf("%s: pciBusID %v, want %s", name, got, g.PCIBusID)
		}
		if got := attrs["resource.kubernetes.io/numaNode"].IntValue; got == nil || *got != int64(g.NUMANode) {
			t.Errorf("%s: numaNode %v, want %d", name, got, g.NUMANode)
		}
		uuid := attrs["uuid"].StringValue
		switch {
		case uuid == nil:
			t.Errorf("%s: no uuid", name)
		case name == "mig" && (!strings.HasPrefix(*uuid, "MIG-") || attrs["parentUUID"].StringValue == nil || *attrs["parentUUID"].StringValue != g.UUID):
			t.Errorf("mig: uuid %s parentUUID %v, want a MIG UUID on %s", *uuid, attrs["parentUUID"].StringValue, g.UUID)
		case name != "mig" && *uuid != g.UUID:
			t.Errorf("%s: uuid %s, want %s", name, *uuid, g.UUID)
		}
		vfio := attrs["vfioDevice"].StringValue
		if name != "vm" {
			if vfio != nil {
				t.Errorf("%s: vfioDevice %s on a device that is not passed through", name, *vfio)
			}
			continue
		}
		if vfio == nil || !strings.HasPrefix(*vfio, "/dev/vfio/") {
			t.Fatalf("vm: vfioDevice %v, want /dev/vfio/<group>", vfio)
		}
		if !slices.ContainsFunc(spec.Linux.Devices, func(d oci.LinuxDevice) bool { return d.Path == *vfio }) {
			t.Errorf("vm: the containers do not get %s, the device the metadata names", *vfio)
		}
	}
}

// readMetadata returns the attributes of the first device in the first object of a metadata
// file's JSON stream (the newest version).
func readMetadata(t *testing.T, path string) map[string]resourceapi.DeviceAttribute {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var md struct {
		APIVersion string `json:"apiVersion"`
		Requests   []struct {
			Devices []struct {
				Attributes map[string]resourceapi.DeviceAttribute `json:"attributes"`
			} `json:"devices"`
		} `json:"requests"`
	}
	if err := json.NewDecoder(f).Decode(&md); err != nil {
		t.Fatalf("metadata %s: %v", path, err)
	}
	if md.APIVersion != "metadata.resource.k8s.io/v1beta1" || len(md.Requests) != 1 || len(md.Requests[0].Devices) != 1 {
		t.Fatalf("metadata %s: %+v", path, md)
	}
	return md.Requests[0].Devices[0].Attributes
}
