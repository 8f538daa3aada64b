package kubectlgpu_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
)

// Each command lists each resource type it reads exactly once, with no
// call per node or claim, and narrows by field selector where it can.
func TestOneListPerResourceType(t *testing.T) {
	tests := map[string]struct {
		cmd  command
		want []string // resource namespace fieldSelector
	}{
		"nodes": {nodes(), []string{
			"resourceclaims  ",
			"resourceslices  spec.driver=gpu.dra.dev",
		}},
		"node": {node("node-a"), []string{
			"resourceclaims  ",
			"resourceslices  spec.driver=gpu.dra.dev,spec.nodeName=node-a",
			"pods  spec.nodeName=node-a",
		}},
		"claims in a namespace": {claims("default"), []string{
			"resourceclaims default ",
			"resourceslices  spec.driver=gpu.dra.dev",
			"deviceclasses  ",
			"pods default ",
		}},
		"claims in all namespaces": {claims(""), []string{
			"resourceclaims  ",
			"resourceslices  spec.driver=gpu.dra.dev",
			"deviceclasses  ",
			"pods  ",
		}},
	}
	c := standardCluster(t).client()
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c.ClearActions()
			mustRun(t, c, tc.cmd, "")
			var got []string
			for _, a := range c.Actions() {
				list, ok := a.(clienttesting.ListActionImpl)
				if !ok {
					t.Errorf("unexpected %s of %s", a.GetVerb(), a.GetResource().Resource)
					continue
				}
				if list.ListOptions.Limit != 500 {
					t.Errorf("list of %s with limit %d, want pages of 500", a.GetResource().Resource, list.ListOptions.Limit)
				}
				got = append(got, fmt.Sprintf("%s %s %s", a.GetResource().Resource, a.GetNamespace(), list.ListOptions.FieldSelector))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDriverNotInstalled(t *testing.T) {
	want := "the gpu.dra.dev driver is not installed or publishes no GPUs (no ResourceSlices with spec.driver=gpu.dra.dev)"
	for name, cmd := range map[string]command{"nodes": nodes(), "claims": claims("")} {
		_, _, err := kubectlGPU(t, fake.NewClientset(), cmd, "")
		if err == nil || err.Error() != want {
			t.Errorf("%s: got %v, want %q", name, err, want)
		}
	}
	// Another driver name: the slices of gpu.dra.dev are not its own.
	_, _, err := kubectlGPU(t, standardCluster(t).client(), nodes(), "", "gpu.example.com")
	if err == nil || !strings.Contains(err.Error(), "the gpu.example.com driver is not installed") {
		t.Errorf("--driver gpu.example.com: got %v", err)
	}
	_, _, err = kubectlGPU(t, fake.NewClientset(), node("node-a"), "")
	if err == nil || !strings.Contains(err.Error(), `node "node-a" publishes no GPUs of the gpu.dra.dev driver`) {
		t.Errorf("node: got %v", err)
	}
}

func forbidden(resource, group string) clienttesting.ReactionFunc {
	return func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: group, Resource: resource}, "",
			fmt.Errorf(`User "dev" cannot list resource %q in API group %q`, resource, group))
	}
}

// A forbidden list names the resource and the verb to grant. Slices and
// claims are needed; pods and DeviceClasses only enrich the output.
func TestForbidden(t *testing.T) {
	tests := map[string]struct {
		resource, group string
		cmd             command
		wantErr         string
		wantWarning     string
	}{
		"slices": {resource: "resourceslices", group: "resource.k8s.io", cmd: nodes(),
			wantErr: `cannot list resourceslices.resource.k8s.io: forbidden; kubectl gpu needs RBAC permission for the verb "list" on resource "resourceslices" in API group "resource.k8s.io"`},
		"claims in a namespace": {resource: "resourceclaims", group: "resource.k8s.io", cmd: claims("default"),
			wantErr: `cannot list resourceclaims.resource.k8s.io in namespace "default": forbidden; kubectl gpu needs RBAC permission for the verb "list" on resource "resourceclaims" in API group "resource.k8s.io"`},
		"claims cluster-wide": {resource: "resourceclaims", group: "resource.k8s.io", cmd: nodes(),
			wantErr: `cannot list resourceclaims.resource.k8s.io in all namespaces: forbidden; kubectl gpu needs RBAC permission for the verb "list" on resource "resourceclaims" in API group "resource.k8s.io"`},
		"pods": {resource: "pods", cmd: claims(""),
			wantWarning: `Warning: cannot list pods in all namespaces: forbidden; kubectl gpu needs RBAC permission for the verb "list" on resource "pods" in API group "" (core); pods are named from the claims' reservedFor, without their phase`},
		"device classes": {resource: "deviceclasses", group: "resource.k8s.io", cmd: claims(""),
			wantWarning: `Warning: cannot list deviceclasses.resource.k8s.io: forbidden; kubectl gpu needs RBAC permission for the verb "list" on resource "deviceclasses" in API group "resource.k8s.io"; pending claims are shown only when they request a class named after the driver`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := standardCluster(t).client()
			c.PrependReactor("list", tc.resource, forbidden(tc.resource, tc.group))
			out, errOut, err := kubectlGPU(t, c, tc.cmd, "")
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Errorf("error:\n got %v\nwant %s", err, tc.wantErr)
				}
				var le *kubectlgpu.ListError
				if !errors.As(err, &le) || le.Resource != tc.resource || !apierrors.IsForbidden(err) {
					t.Errorf("error %T does not unwrap to a forbidden ListError for %s", err, tc.resource)
				}
				return
			}
			if err != nil {
				t.Fatalf("a forbidden list of %s failed the command: %v", tc.resource, err)
			}
			if strings.TrimSpace(errOut) != tc.wantWarning {
				t.Errorf("stderr:\n got %s\nwant %s", errOut, tc.wantWarning)
			}
			if !strings.Contains(out, "ts-a") {
				t.Errorf("claims missing:\n%s", out)
			}
		})
	}
}

func TestAPINotServed(t *testing.T) {
	c := fake.NewClientset()
	c.PrependReactor("list", "resourceslices", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}, "")
	})
	_, _, err := kubectlGPU(t, c, nodes(), "")
	if err == nil || !strings.Contains(err.Error(), "the API server does not serve resource.k8s.io/v1 (DRA needs Kubernetes 1.34 or later)") {
		t.Errorf("got %v", err)
	}
}

// Large lists come in pages; an expired continue token falls back to one
// full list.
func TestPagination(t *testing.T) {
	f := standardCluster(t)
	var all []resourceapi.ResourceSlice
	for _, s := range f.slices {
		all = append(all, *s)
	}
	for name, expire := range map[string]bool{"pages": false, "expired token": true} {
		t.Run(name, func(t *testing.T) {
			c := f.client()
			var calls []string
			c.PrependReactor("list", "resourceslices", func(a clienttesting.Action) (bool, runtime.Object, error) {
				opts := a.(clienttesting.ListActionImpl).ListOptions
				calls = append(calls, fmt.Sprintf("limit=%d continue=%q", opts.Limit, opts.Continue))
				start, _ := strconv.Atoi(opts.Continue)
				if opts.Limit == 0 {
					return true, &resourceapi.ResourceSliceList{Items: all}, nil
				}
				if expire && start > 0 {
					return true, nil, apierrors.NewResourceExpired("continue token expired")
				}
				end := min(start+3, len(all)) // the server may return fewer than the limit
				list := &resourceapi.ResourceSliceList{Items: all[start:end]}
				if end < len(all) {
					list.Continue = strconv.Itoa(end)
				}
				return true, list, nil
			})
			src, err := kubectlgpu.Fetch(context.Background(), c, kubectlgpu.Scope{Driver: driverName})
			if err != nil {
				t.Fatal(err)
			}
			if len(src.Slices) != len(all) {
				t.Errorf("got %d slices, want %d; calls %v", len(src.Slices), len(all), calls)
			}
			wantCalls := (len(all) + 2) / 3
			if expire {
				wantCalls = 3 // first page, expired second page, full list
			}
			if len(calls) != wantCalls {
				t.Errorf("%d calls, want %d: %v", len(calls), wantCalls, calls)
			}
			// Load builds as the pages come; a restart must not count the
			// first pages twice.
			inv, _, err := kubectlgpu.Load(context.Background(), c, kubectlgpu.Scope{Driver: driverName})
			if err != nil {
				t.Fatal(err)
			}
			if total := inv.NodeList().Total; total.GPUs != 12 || total.Free != 6 {
				t.Errorf("after paging: %d GPUs, %d free, want 12 and 6", total.GPUs, total.Free)
			}
		})
	}
}

// Only the newest generation of a pool counts: slices of an older one are
// being replaced.
func TestOldPoolGenerationIgnored(t *testing.T) {
	f := newFixture(t, "node-a=l4x4")
	src := &kubectlgpu.Source{}
	for _, s := range f.slices {
		src.Slices = append(src.Slices, *s)
		stale := s.DeepCopy()
		stale.Name += "-old"
		stale.Spec.Pool.Generation = 0
		for i := range stale.Spec.Devices {
			stale.Spec.Devices[i].Name += "-stale"
		}
		src.Slices = append(src.Slices, *stale)
	}
	// Another driver's slices on the same node are not ours.
	src.Slices = append(src.Slices, resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "nic"},
		Spec: resourceapi.ResourceSliceSpec{Driver: "nic.example.com", Pool: resourceapi.ResourcePool{Name: "node-a", Generation: 7},
			Devices: []resourceapi.Device{{Name: "nic-0"}}},
	})
	inv := kubectlgpu.Build(driverName, src)
	n := inv.Node("node-a")
	if n == nil || len(n.GPUs) != 4 || n.Devices != 12 || n.Unrecognized != 0 {
		t.Fatalf("node-a: %+v", n)
	}
	for _, g := range n.GPUs {
		if slices.ContainsFunc(g.Devices, func(d *kubectlgpu.Device) bool { return strings.HasSuffix(d.Name, "-stale") }) {
			t.Errorf("%s has devices of the old generation", g.Name)
		}
	}
}
