package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// dcgm-exporter's DRA mapping, mirrored: NVIDIA/dcgm-exporter at commit
// d5e5f510a1b6b393f39a43293ccd9dc985defc79, internal/pkg/transformation:
//   - dra.go, NewDRAResourceSliceManager / onAddOrUpdate: an informer on
//     resource.k8s.io/v1beta1 ResourceSlices with spec.driver == "gpu.nvidia.com"
//     (const.go DRAGPUDriverName); for each device with Basic attributes, key
//     "<spec.pool.name>/<device name>"; attribute "type" "gpu" maps the key to
//     attribute "uuid"; "mig" (with a non-empty "parentUUID") to {uuid,
//     profile, parentUUID}; other types are logged and skipped.
//   - dra.go GetDeviceInfo: a MIG key gives (parentUUID, MIG info), a GPU key
//     gives (uuid, nil).
//   - kubernetes.go toDeviceToPodsDRA: the kubelet's podresources List; per
//     container, each DynamicResources' ClaimResources of driver
//     "gpu.nvidia.com" is looked up by (PoolName, DeviceName).
//
// The package is internal to dcgm-exporter's module (and the module is not
// served by the Go proxy here), so it cannot be imported; this mirror keeps
// exactly the fields and keys it reads.

// dcgmDevice is what dcgm-exporter labels a container's metrics with.
type dcgmDevice struct {
	UUID                   string // GPU UUID; for a MIG device its parent's
	MIGProfile, MIGUUID    string // dra_mig_profile, dra_mig_device_uuid
	Pool, Device, Claim    string
	ClaimNamespace, Driver string
}

// dcgmSliceIndex is dra.go's deviceToUUID and migDevices maps.
type dcgmSliceIndex struct {
	gpu map[string]string
	mig map[string]dcgmDevice
}

// newDCGMSliceIndex lists the slices as dcgm-exporter's informer sees them:
// through resource.k8s.io/v1beta1. Where the API server does not serve that
// version dcgm-exporter's informer cannot sync (it then runs without DRA
// labels); the test reports it and reads v1, which holds the same attributes.
func newDCGMSliceIndex(t *testing.T, ctx context.Context) dcgmSliceIndex {
	t.Helper()
	idx := dcgmSliceIndex{gpu: map[string]string{}, mig: map[string]dcgmDevice{}}
	str := func(a map[string]*string, k string) string {
		if v := a[k]; v != nil {
			return *v
		}
		return ""
	}
	add := func(pool, name string, attrs map[string]*string) {
		key := pool + "/" + name
		switch str(attrs, "type") {
		case "gpu":
			if u := str(attrs, "uuid"); u != "" {
				idx.gpu[key] = u
			}
		case "mig":
			if p := str(attrs, "parentUUID"); p != "" {
				idx.mig[key] = dcgmDevice{UUID: p, MIGProfile: str(attrs, "profile"), MIGUUID: str(attrs, "uuid")}
			}
		}
	}
	list, err := env.cluster.Client.ResourceV1beta1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, s := range list.Items {
			if s.Spec.Driver != "gpu.nvidia.com" {
				continue
			}
			for _, d := range s.Spec.Devices {
				if d.Basic == nil || d.Basic.Attributes == nil {
					continue
				}
				attrs := map[string]*string{}
				for k, v := range d.Basic.Attributes {
					attrs[string(k)] = v.StringValue
				}
				add(s.Spec.Pool.Name, d.Name, attrs)
			}
		}
		return idx
	}
	if !apierrors.IsNotFound(err) {
		t.Fatalf("list v1beta1 ResourceSlices: %v", err)
	}
	t.Logf("resource.k8s.io/v1beta1 is not served: dcgm-exporter %s's informer could not sync here; reading v1", "d5e5f51")
	for _, s := range driverSlices(t, ctx, "gpu.nvidia.com", "") {
		for _, d := range s.Spec.Devices {
			attrs := map[string]*string{}
			for k, v := range d.Attributes {
				attrs[string(k)] = v.StringValue
			}
			add(s.Spec.Pool.Name, d.Name, attrs)
		}
	}
	return idx
}

// dcgmMapping resolves pod's containers to devices as toDeviceToPodsDRA does,
// from the node's kubelet podresources List.
func dcgmMapping(t *testing.T, ctx context.Context, idx dcgmSliceIndex, node, ns, pod string) map[string][]dcgmDevice {
	t.Helper()
	sock := filepath.Join(env.nodesDir, node, "kubelet", "pod-resources", "kubelet.sock")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("podresources %s: %v", sock, err)
	}
	defer conn.Close()
	resp, err := podresourcesv1.NewPodResourcesListerClient(conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("podresources List on %s: %v", sock, err)
	}
	out := map[string][]dcgmDevice{}
	for _, p := range resp.GetPodResources() {
		if p.GetNamespace() != ns || p.GetName() != pod {
			continue
		}
		for _, c := range p.GetContainers() {
			for _, dr := range c.GetDynamicResources() {
				for _, cr := range dr.GetClaimResources() {
					if cr.GetDriverName() != "gpu.nvidia.com" {
						continue
					}
					key := cr.GetPoolName() + "/" + cr.GetDeviceName()
					d, ok := idx.mig[key]
					if !ok {
						u, found := idx.gpu[key]
						if !found {
							continue // dcgm-exporter: "No UUID for <pool>/<device>"
						}
						d = dcgmDevice{UUID: u}
					}
					d.Pool, d.Device, d.Driver = cr.GetPoolName(), cr.GetDeviceName(), cr.GetDriverName()
					d.Claim, d.ClaimNamespace = dr.GetClaimName(), dr.GetClaimNamespace()
					out[c.GetName()] = append(out[c.GetName()], d)
				}
			}
		}
	}
	return out
}

// checkDCGMMapping checks that dcgm-exporter's mapping of the pod's containers
// names the device of the pod's claim allocation and the one the plugin
// prepared (the container's NVIDIA_VISIBLE_DEVICES).
func checkDCGMMapping(t *testing.T, ctx context.Context, devs map[string]sliceDevice, ns, name string, mig bool) {
	t.Helper()
	pod, err := env.cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	alloc := podDevices(t, ctx, devs, []corev1.Pod{*pod}, name)
	if len(alloc) != 1 {
		t.Fatalf("pod %s/%s: want one allocated device, have %v", ns, name, alloc)
	}
	want := alloc[0]
	got := dcgmMapping(t, ctx, newDCGMSliceIndex(t, ctx), pod.Spec.NodeName, ns, name)
	prepared := containerEnv(t, ctx, pod, "NVIDIA_VISIBLE_DEVICES")
	for _, c := range pod.Spec.Containers {
		ds := got[c.Name]
		if len(ds) != 1 {
			t.Errorf("dcgm-exporter maps container %s/%s/%s to %d devices %+v, want 1 (%s)", ns, name, c.Name, len(ds), ds, want.key)
			continue
		}
		d := ds[0]
		if d.Pool+"/"+d.Device != want.key {
			t.Errorf("dcgm-exporter: %s/%s on %s/%s, the claim allocated %s", ns, name, d.Pool, d.Device, want.key)
		}
		if !mig {
			if d.UUID != want.attr("uuid") || d.UUID != prepared || d.MIGProfile != "" {
				t.Errorf("dcgm-exporter: %s/%s GPU %q (MIG %q), slice uuid %q, prepared %q", ns, name, d.UUID, d.MIGProfile, want.attr("uuid"), prepared)
			}
			continue
		}
		parent := ""
		for _, g := range devs {
			if g.attr("type") == "gpu" && g.attr("uuid") == want.attr("parentUUID") {
				parent = g.attr("uuid")
			}
		}
		if d.UUID == "" || d.UUID != parent || d.MIGProfile != want.attr("profile") || d.MIGProfile != "1g.10gb" {
			t.Errorf("dcgm-exporter: %s/%s parent %q profile %q; slice parentUUID %q (a GPU of the node: %q), profile %q, want 1g.10gb",
				ns, name, d.UUID, d.MIGProfile, want.attr("parentUUID"), parent, want.attr("profile"))
		}
		if !strings.HasPrefix(prepared, "MIG-") {
			t.Errorf("the plugin prepared %q for %s/%s, want a MIG device", prepared, ns, name)
		}
		// A MIG device created at prepare has no uuid in the slice (it does
		// not exist when published): dcgm-exporter's dra_mig_device_uuid is
		// then empty. A static one's must be the prepared one.
		if d.MIGUUID != "" && d.MIGUUID != prepared {
			t.Errorf("dcgm-exporter: %s/%s MIG uuid %q, prepared %q", ns, name, d.MIGUUID, prepared)
		}
		t.Logf("dcgm-exporter labels %s/%s: UUID=%s dra_mig_profile=%s dra_mig_device_uuid=%q (prepared %s)", ns, name, d.UUID, d.MIGProfile, d.MIGUUID, prepared)
	}
}

// sliceDevice is a device of a ResourceSlice: "<pool>/<name>" and its attributes.
type sliceDevice struct {
	key   string
	attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
}

func (d sliceDevice) attr(name string) string {
	if v, ok := d.attrs[resourceapi.QualifiedName(name)]; ok {
		if v.StringValue != nil {
			return *v.StringValue
		}
		if v.VersionValue != nil {
			return *v.VersionValue
		}
		if v.IntValue != nil {
			return fmt.Sprint(*v.IntValue)
		}
	}
	return ""
}

func (d sliceDevice) String() string { return d.key + "(" + d.attr("type") + ")" }

// driverSlices lists the ResourceSlices of driver (on node unless "").
func driverSlices(t *testing.T, ctx context.Context, driver, node string) []resourceapi.ResourceSlice {
	t.Helper()
	sel := "spec.driver=" + driver
	if node != "" {
		sel += ",spec.nodeName=" + node
	}
	list, err := env.cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// nodeDevices indexes the node's devices of driver by "<pool>/<name>".
func nodeDevices(t *testing.T, ctx context.Context, driver, node string) map[string]sliceDevice {
	t.Helper()
	out := map[string]sliceDevice{}
	for _, s := range driverSlices(t, ctx, driver, node) {
		for _, d := range s.Spec.Devices {
			k := s.Spec.Pool.Name + "/" + d.Name
			out[k] = sliceDevice{key: k, attrs: d.Attributes}
		}
	}
	return out
}

// podDevices returns the devices allocated to the claims of the named pod.
func podDevices(t *testing.T, ctx context.Context, devs map[string]sliceDevice, pods []corev1.Pod, name string) []sliceDevice {
	t.Helper()
	for _, p := range pods {
		if p.Name != name {
			continue
		}
		var out []sliceDevice
		for _, pc := range p.Spec.ResourceClaims {
			claimName := pc.ResourceClaimName // a claim of its own (gpu-test3)
			for _, st := range p.Status.ResourceClaimStatuses {
				if st.Name == pc.Name {
					claimName = st.ResourceClaimName // generated from a template
				}
			}
			if claimName == nil {
				t.Fatalf("pod %s/%s: no claim for %s yet", p.Namespace, name, pc.Name)
			}
			claim, err := env.cluster.Client.ResourceV1().ResourceClaims(p.Namespace).Get(ctx, *claimName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if claim.Status.Allocation == nil {
				t.Fatalf("claim %s/%s of pod %s is not allocated", p.Namespace, claim.Name, name)
			}
			for _, r := range claim.Status.Allocation.Devices.Results {
				k := r.Pool + "/" + r.Device
				d, ok := devs[k]
				if !ok {
					t.Fatalf("claim %s/%s: device %s (driver %s) is not among the node's slices", p.Namespace, claim.Name, k, r.Driver)
				}
				out = append(out, d)
			}
		}
		return out
	}
	t.Fatalf("no pod %s", name)
	return nil
}

// wantGPUs checks that devs are n whole GPUs.
func wantGPUs(t *testing.T, devs []sliceDevice, n int) {
	t.Helper()
	if len(devs) != n {
		t.Errorf("got devices %v, want %d GPU(s)", devs, n)
	}
	for _, d := range devs {
		if d.attr("type") != "gpu" || !strings.HasPrefix(d.attr("uuid"), "GPU-") {
			t.Errorf("device %s: type %q uuid %q, want a whole GPU", d.key, d.attr("type"), d.attr("uuid"))
		}
	}
}
