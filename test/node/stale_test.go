package node

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/staleclaims"
)

// TestStaleClaimReleased: a claim prepared on GPU 0 whose ResourceClaim is
// deleted while the kubelet never unprepares it (the kubelet lost its DRA
// state) is released after the grace period, not before: its CDI spec, MIG
// instance or MPS daemon go, an event on the Node says so, and a whole-GPU
// claim the scheduler then gives GPU 0 to prepares.
func TestStaleClaimReleased(t *testing.T) {
	const grace = 3 * time.Second
	mps := at.Exactly("mps", "mps."+driverName, 1, `device.attributes["gpu.dra.dev"].minor == 0`)
	mps.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"compute": resource.MustParse("50")}}
	for name, old := range map[string]*resourceapi.ResourceClaim{
		"gpu": at.Claim("old", at.Exactly("gpus", driverName, 1, `device.attributes["gpu.dra.dev"].minor == 0`)),
		"mig": migClaim("old", "1g.10gb"),
		"mps": at.Claim("old", mps),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dirs, err := pluginrun.NewDirs(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			node := simnode.New(t, machine, nodeName)
			allocate := func(claim *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
				// A cluster of its own: the scheduler's view once the old claim is gone.
				c := at.NewCluster(node.Slices(driverName), deviceclass.DeviceClasses(driverName))
				return c.MustAllocate(t, nodeName, claim)[0]
			}
			old = allocate(old)
			replacement := allocate(at.Claim("new", at.Exactly("gpus", driverName, 1, `device.attributes["gpu.dra.dev"].minor == 0`)))
			replacement.UID = "new-uid"
			control, err := pluginrun.BuildMPSControl(dirs.Root)
			if err != nil {
				t.Fatal(err)
			}
			cfg := dirs.Config(machine, nodeName)
			cfg.MPSControl = control
			cfg.StaleClaimGracePeriod = grace
			client := apiserver.NodeClient(nodeName, old, replacement)
			cfg.KubeClient = client
			p, err := inprocess.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = p.Stop() }()
			if _, err := p.Kubelet.PrepareOne(ctx, old); err != nil {
				t.Fatal(err)
			}
			if name == "mps" && len(mpsDaemons(t, cfg.MPSDir)) != 1 {
				t.Fatal("no MPS daemon for the prepared share")
			}

			// The pod and its claim are force-deleted; the kubelet lost its
			// record of the claim and never unprepares it.
			if err := client.ResourceV1().ResourceClaims(old.Namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			deleted := time.Now()
			if _, err := p.Kubelet.PrepareOne(ctx, replacement); err == nil || !strings.Contains(err.Error(), "already prepared for claim") {
				t.Fatalf("GPU 0 prepared for a second claim while the stale one holds it (err %v)", err)
			}
			deadline := time.Now().Add(grace + time.Minute)
			for {
				_, err := p.Kubelet.PrepareOne(ctx, replacement)
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("GPU 0 still held %s after the stale claim's deletion: %v", time.Since(deleted), err)
				}
				time.Sleep(200 * time.Millisecond)
			}
			if held := time.Since(deleted); held < grace {
				t.Errorf("the stale claim was released %s after its deletion, within the %s grace period", held, grace)
			}
			if specs := specFiles(t, dirs.CDI, old); len(specs) != 0 {
				t.Errorf("the stale claim's CDI spec is left: %v", specs)
			}
			if d := mpsDaemons(t, cfg.MPSDir); len(d) != 0 {
				t.Errorf("the stale MPS share's daemon still runs: %v", d)
			}
			events, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, ev := range events.Items {
				found = found || ev.Reason == staleclaims.EventReason && ev.InvolvedObject.Kind == "Node" &&
					ev.InvolvedObject.Name == nodeName && strings.Contains(ev.Message, string(old.UID))
			}
			if !found {
				t.Errorf("no %s event on Node %s naming claim %s: %v", staleclaims.EventReason, nodeName, old.UID, events.Items)
			}
		})
	}
}

func mpsDaemons(t *testing.T, mpsDir string) []string {
	t.Helper()
	d, err := filepath.Glob(filepath.Join(mpsDir, "*", "*", "nvidia-cuda-mps-control.pid"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}
