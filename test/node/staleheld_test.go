package node

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/kubelet"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/staleclaims"
)

// staleNode is a plugin with a short stale-claim grace period, the kubelet
// stand-in's PodResources socket, and a claim "old" on GPU 0 reserved for
// pod "tenant", prepared.
type staleNode struct {
	cfg    *nodeplugin.Config
	client *fake.Clientset
	p      *inprocess.Plugin
	kl     *kubelet.PodResources
	old    *resourceapi.ResourceClaim
	pod    *corev1.Pod
	// allocate allocates a claim on the node as the scheduler would with
	// nothing else allocated.
	allocate func(*resourceapi.ResourceClaim) *resourceapi.ResourceClaim
}

const staleGrace = 2 * time.Second

func gpu0Claim(name string) *resourceapi.ResourceClaim {
	return at.Claim(name, at.Exactly("gpus", driverName, 1, `device.attributes["gpu.dra.dev"].minor == 0`))
}

func startStaleNode(ctx context.Context, t *testing.T) *staleNode {
	t.Helper()
	dirs, err := pluginrun.NewDirs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n := &staleNode{}
	sim := simnode.New(t, machine, nodeName)
	n.allocate = func(claim *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
		c := at.NewCluster(sim.Slices(driverName), deviceclass.DeviceClasses(driverName))
		return c.MustAllocate(t, nodeName, claim)[0]
	}
	n.old = n.allocate(gpu0Claim("old"))
	n.pod = &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: n.old.Namespace, Name: "tenant", UID: "tenant-uid"},
		Spec:       corev1.PodSpec{NodeName: nodeName},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	n.old.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: n.pod.Name, UID: n.pod.UID}}

	// A unix socket path must be short; t.TempDir's may not be.
	sockDir, err := os.MkdirTemp("", "podres")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	n.cfg = dirs.Config(machine, nodeName)
	n.cfg.StaleClaimGracePeriod = staleGrace
	n.cfg.PodResourcesSocket = filepath.Join(sockDir, "kubelet.sock")
	if n.kl, err = kubelet.ServePodResources(n.cfg.PodResourcesSocket); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.kl.Stop)
	n.client = apiserver.NodeClient(nodeName, n.old)
	if err := n.client.Tracker().Add(n.pod); err != nil {
		t.Fatal(err)
	}
	n.cfg.KubeClient = n.client
	if n.p, err = inprocess.Start(ctx, n.cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.p.Stop() })
	if _, err := n.p.Kubelet.PrepareOne(ctx, n.old); err != nil {
		t.Fatal(err)
	}
	return n
}

// prepared returns the checkpoint's entry of claim uid.
func (n *staleNode) prepared(t *testing.T, uid types.UID) (*checkpoint.PreparedClaim, bool) {
	t.Helper()
	cp, err := checkpoint.NewFileStore(filepath.Join(n.cfg.PluginDataDir, nodeplugin.CheckpointFile)).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return cp.Get(uid)
}

func (n *staleNode) events(t *testing.T, reason string) []string {
	t.Helper()
	out, err := apiserver.NodeEventMessages(context.Background(), n.client, nodeName, reason)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestStaleClaimHeldWhileInUse: a tenant deletes its claim (or deletes it
// and creates another of the same name) while its pod runs. After the
// grace period the plugin holds the claim back, says why on the Node, and
// GPU 0 is not prepared for a second tenant's claim; once the pod ends it
// is released and the second claim prepares.
func TestStaleClaimHeldWhileInUse(t *testing.T) {
	for name, tc := range map[string]struct {
		recreate bool
		// evidence is what says the container runs; it returns what ends it.
		evidence func(t *testing.T, n *staleNode) (end func())
		wantHeld string
	}{
		"deleted, the kubelet lists the container": {evidence: func(t *testing.T, n *staleNode) func() {
			n.deletePod(t) // force-deleted: only the kubelet still knows
			return n.kl.Run("tenant", "cuda", n.old, driverName)
		}, wantHeld: staleclaims.HeldContainer},
		"deleted, the pod runs": {evidence: func(t *testing.T, n *staleNode) func() {
			return func() { n.deletePod(t) }
		}, wantHeld: staleclaims.HeldPod},
		"recreated, the kubelet lists the container": {recreate: true, evidence: func(t *testing.T, n *staleNode) func() {
			stop := n.kl.Run("tenant", "cuda", n.old, driverName)
			return func() { stop(); n.deletePod(t) }
		}, wantHeld: staleclaims.HeldContainer},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			n := startStaleNode(ctx, t)
			end := tc.evidence(t, n)
			if err := n.client.ResourceV1().ResourceClaims(n.old.Namespace).Delete(ctx, n.old.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if tc.recreate { // same name, new UID, not allocated yet
				again := gpu0Claim("old")
				again.UID = "old-again"
				if _, err := n.client.ResourceV1().ResourceClaims(again.Namespace).Create(ctx, again, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// The second tenant's claim, given GPU 0 by a scheduler that no
			// longer sees the first claim.
			second := n.allocate(gpu0Claim("second"))
			second.UID = "second-uid"
			if _, err := n.client.ResourceV1().ResourceClaims(second.Namespace).Create(ctx, second, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}

			eventually(t, staleGrace+30*time.Second, "the claim held back or released", func() bool {
				return len(n.events(t, staleclaims.HeldEventReason))+len(n.events(t, staleclaims.EventReason)) > 0
			})
			if released := n.events(t, staleclaims.EventReason); len(released) != 0 {
				t.Fatalf("released while its container runs: %q", released)
			}
			held := n.events(t, staleclaims.HeldEventReason)
			if !strings.Contains(held[0], string(n.old.UID)) || !strings.Contains(held[0], tc.wantHeld) {
				t.Errorf("hold event %q does not name claim %s and %s", held[0], n.old.UID, tc.wantHeld)
			}
			if _, ok := n.prepared(t, n.old.UID); !ok {
				t.Fatal("the held claim is gone from the checkpoint")
			}
			if _, err := n.p.Kubelet.PrepareOne(ctx, second); err == nil {
				t.Fatal("GPU 0 prepared for a second tenant while the first tenant's container runs")
			}

			end()
			eventually(t, 30*time.Second, "GPU 0 prepared for the second tenant once the first pod ended", func() bool {
				_, err := n.p.Kubelet.PrepareOne(ctx, second)
				return err == nil
			})
			if _, ok := n.prepared(t, n.old.UID); ok {
				t.Error("the released claim is still in the checkpoint")
			}
			if len(n.events(t, staleclaims.EventReason)) != 1 {
				t.Errorf("no %s event once released", staleclaims.EventReason)
			}
		})
	}
}

func (n *staleNode) deletePod(t *testing.T) {
	t.Helper()
	if err := n.client.CoreV1().Pods(n.pod.Namespace).Delete(context.Background(), n.pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestReallocatedClaimConverges: a claim prepared on GPU 0 comes back
// with the same UID allocated on this node to GPU 1 (the kubelet lost its
// record, the claim was deallocated and allocated again). Prepare refuses
// it while the old preparation stands; the releaser calls the old one
// stale (reallocated), releases it once its pod is gone, and the kubelet's
// next retry prepares GPU 1.
func TestReallocatedClaimConverges(t *testing.T) {
	ctx := context.Background()
	n := startStaleNode(ctx, t)
	n.deletePod(t)
	again := n.allocate(at.Claim("old", at.Exactly("gpus", driverName, 1, `device.attributes["gpu.dra.dev"].minor == 1`)))
	again.UID = n.old.UID
	again.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "tenant-2", UID: "tenant-2-uid"}}
	if _, err := n.client.ResourceV1().ResourceClaims(again.Namespace).UpdateStatus(ctx, again, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The new pod's container is listed, waiting for its claim: the
	// kubelet names no prepared device of it yet.
	pending := again.DeepCopy()
	pending.Status.Allocation = nil
	n.kl.Run("tenant-2", "cuda", pending, driverName)

	if _, err := n.p.Kubelet.PrepareOne(ctx, again); err == nil {
		t.Fatal("a claim reallocated under the same UID prepared over its old preparation")
	}
	eventually(t, staleGrace+30*time.Second, "the reallocated claim prepared", func() bool {
		_, err := n.p.Kubelet.PrepareOne(ctx, again)
		return err == nil
	})
	want := again.Status.Allocation.Devices.Results[0].Device
	if entry, ok := n.prepared(t, again.UID); !ok || !slices.ContainsFunc(entry.Devices, func(d checkpoint.PreparedDevice) bool { return d.Device == want }) {
		t.Errorf("checkpoint entry %+v, want the claim prepared with %s", entry, want)
	}
	released := n.events(t, staleclaims.EventReason)
	if len(released) != 1 || !strings.Contains(released[0], "reallocated") {
		t.Errorf("release events %q, want one saying reallocated", released)
	}
	// GPU 0 is free again.
	third := n.allocate(gpu0Claim("third"))
	third.UID = "third-uid"
	if _, err := n.client.ResourceV1().ResourceClaims(third.Namespace).Create(ctx, third, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.p.Kubelet.PrepareOne(ctx, third); err != nil {
		t.Errorf("GPU 0 not free after the reallocated claim moved: %v", err)
	}
}
