package node

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// TestReservePolicy runs the plugin with `reserve: {spareGPUs: 1}`: after the
// start hold only the spare GPU 0 publishes MIG placements and shares; a
// claim the scheduler allocated on it (never prepared) makes GPU 1 the
// spare too; once the claim is gone GPU 0 stops publishing them a hold
// later, and GPU 1 stays the spare, also across a restart of the plugin.
func TestReservePolicy(t *testing.T) {
	ctx := context.Background()
	dirs, err := pluginrun.NewDirs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	policyFile := filepath.Join(t.TempDir(), "device-policy.yaml")
	if err := os.WriteFile(policyFile, []byte("reserve: {spareGPUs: 1, holdSeconds: 2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	client := apiserver.NodeClient(nodeName)
	start := func() *inprocess.Plugin {
		cfg := dirs.Config(machine, nodeName)
		cfg.DevicePolicyFile = policyFile
		cfg.KubeClient = client
		p, err := inprocess.Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// partitioned lists the GPUs whose MIG placements or shares are published.
	partitioned := func() []string {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		gpus := map[string]bool{}
		for _, s := range list.Items {
			for i := range s.Spec.Devices {
				if gpu, ok := devicemodel.ReservableGPU(&s.Spec.Devices[i]); ok {
					gpus[gpu] = true
				}
			}
		}
		return slices.Sorted(maps.Keys(gpus))
	}
	expect := func(what string, want ...string) {
		t.Helper()
		eventually(t, 20*time.Second, what, func() bool { return slices.Equal(partitioned(), want) })
	}

	p := start()
	expect("every GPU's at start", "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7")
	expect("the spare's after the start hold", "gpu-7")

	claim := at.Claim("mig", at.Exactly("mig", "mig."+driverName, 1, at.Profile("1g.10gb")))
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "mig", Driver: driverName, Pool: nodeName, Device: "gpu-7-mig-1g10gb-6"}},
	}}
	claims := client.ResourceV1().ResourceClaims(claim.Namespace)
	if _, err := claims.Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("a MIG device allocated on the spare", "gpu-6", "gpu-7")
	if err := claims.Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("the claim gone, a hold later", "gpu-6")

	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	p = start()
	defer func() { _ = p.Stop() }()
	expect("every GPU's after the restart", "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7")
	expect("the same spare after the restart", "gpu-6")
}
