package staleclaims

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/component-base/metrics"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/kubelet"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// guardFixture is a node with a stale claim (its ResourceClaim deleted)
// recorded for pod "p" (UID pod-1) on a whole GPU of a simulated machine.
type guardFixture struct {
	client  *fake.Clientset
	opts    *Options
	engine  *engine
	machine *nvmlsim.Machine
	claim   checkpoint.PreparedClaim
}

func (f *guardFixture) pod(nodeName string, uid types.UID, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "stale", Name: "p", UID: uid},
		Spec:       corev1.PodSpec{NodeName: nodeName},
		Status:     corev1.PodStatus{Phase: phase},
	}
}

func (f *guardFixture) must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestGuards: a claim stale for the grace period is held back while any
// evidence says a container may still use it (and when evidence cannot be
// read), with an event and the held metric, and released once the
// evidence is gone.
func TestGuards(t *testing.T) {
	for name, tc := range map[string]struct {
		// setup creates the evidence; it returns what ends it, nil when
		// there is nothing to hold the claim.
		setup    func(t *testing.T, f *guardFixture) (end func())
		wantHeld string
	}{
		"no evidence": {setup: func(*testing.T, *guardFixture) func() { return nil }},
		"recorded pod running": {wantHeld: HeldPod, setup: func(t *testing.T, f *guardFixture) func() {
			p := f.pod(node, "pod-1", corev1.PodRunning)
			_, err := f.client.CoreV1().Pods("stale").Create(t.Context(), p, metav1.CreateOptions{})
			f.must(t, err)
			return func() {
				p.Status.Phase = corev1.PodSucceeded
				_, err := f.client.CoreV1().Pods("stale").Update(t.Context(), p, metav1.UpdateOptions{})
				f.must(t, err)
			}
		}},
		"recorded pod terminating": {wantHeld: HeldPod, setup: func(t *testing.T, f *guardFixture) func() {
			p := f.pod(node, "pod-1", corev1.PodRunning)
			p.DeletionTimestamp = &metav1.Time{Time: time.Unix(1e9, 0)}
			_, err := f.client.CoreV1().Pods("stale").Create(t.Context(), p, metav1.CreateOptions{})
			f.must(t, err)
			return func() { f.must(t, f.client.CoreV1().Pods("stale").Delete(t.Context(), "p", metav1.DeleteOptions{})) }
		}},
		"pod of the same name, another UID": {setup: func(t *testing.T, f *guardFixture) func() {
			_, err := f.client.CoreV1().Pods("stale").Create(t.Context(), f.pod(node, "pod-2", corev1.PodRunning), metav1.CreateOptions{})
			f.must(t, err)
			return nil
		}},
		"recorded pod on another node": {setup: func(t *testing.T, f *guardFixture) func() {
			_, err := f.client.CoreV1().Pods("stale").Create(t.Context(), f.pod("node-2", "pod-1", corev1.PodRunning), metav1.CreateOptions{})
			f.must(t, err)
			return nil
		}},
		"pods cannot be read": {wantHeld: HeldUnknown, setup: func(t *testing.T, f *guardFixture) func() {
			failing := true
			f.client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) { return failing, nil, errTest })
			return func() { failing = false }
		}},
		"kubelet lists a container": {wantHeld: HeldContainer, setup: func(t *testing.T, f *guardFixture) func() {
			return f.kubelet(t).Run("p", "c", claim("uid-1", node), driver)
		}},
		"kubelet lists the name with another device": {setup: func(t *testing.T, f *guardFixture) func() {
			c := claim("uid-2", node)
			c.Status.Allocation.Devices.Results[0].Device = "gpu-1"
			f.kubelet(t).Run("p2", "c", c, driver)
			return nil
		}},
		"kubelet socket missing": {wantHeld: HeldUnknown, setup: func(t *testing.T, f *guardFixture) func() {
			f.kubelet(t).Stop() // the kubelet is down, its socket gone
			return func() {
				k, err := kubelet.ServePodResources(f.opts.PodResourcesSocket)
				f.must(t, err)
				t.Cleanup(k.Stop)
			}
		}},
		"kubelet List fails": {wantHeld: HeldUnknown, setup: func(t *testing.T, f *guardFixture) func() {
			k := f.kubelet(t)
			k.Fail(errTest)
			return func() { k.Fail(nil) }
		}},
		"process on the GPU": {wantHeld: HeldProcess, setup: func(t *testing.T, f *guardFixture) func() {
			unregister, err := f.machine.RegisterProcess(4242, nvmlsim.Registration{Devices: []string{f.machine.GPUUUID(0)}, SMPercent: 10})
			f.must(t, err)
			return unregister
		}},
		"process on another GPU": {setup: func(t *testing.T, f *guardFixture) func() {
			_, err := f.machine.RegisterProcess(4242, nvmlsim.Registration{Devices: []string{f.machine.GPUUUID(1)}, SMPercent: 10})
			f.must(t, err)
			return nil
		}},
		"MPS share, an MPS client": {wantHeld: HeldProcess, setup: func(t *testing.T, f *guardFixture) func() {
			f.mpsShare()
			unregister, err := f.machine.RegisterProcess(4242, nvmlsim.Registration{Devices: []string{f.machine.GPUUUID(0)}, SMPercent: 10, MPS: true})
			f.must(t, err)
			return unregister
		}},
		"MPS share, only the MPS server": {setup: func(t *testing.T, f *guardFixture) func() {
			f.mpsShare()
			_, err := f.machine.RegisterProcess(4242, nvmlsim.Registration{Devices: []string{f.machine.GPUUUID(0)}, SMPercent: 1})
			f.must(t, err)
			return nil
		}},
		"shared GPU, another claim's pod's process": {setup: func(t *testing.T, f *guardFixture) func() {
			f.share(t, "3e9a1c2b-7f4d-4c1e-9b2a-5d6e7f8a9b0c")
			return nil
		}},
		"shared GPU, a process of a pod of both claims": {wantHeld: HeldProcess, setup: func(t *testing.T, f *guardFixture) func() {
			unregister := f.share(t, "3e9a1c2b-7f4d-4c1e-9b2a-5d6e7f8a9b0c")
			f.engine.claims[0].Pods = append(f.engine.claims[0].Pods, checkpoint.ReservedPod{Name: "q", UID: "3e9a1c2b-7f4d-4c1e-9b2a-5d6e7f8a9b0c"})
			return unregister
		}},
		"shared GPU, a process of no known pod": {wantHeld: HeldProcess, setup: func(t *testing.T, f *guardFixture) func() {
			unregister := f.share(t, "11111111-7f4d-4c1e-9b2a-5d6e7f8a9b0c")
			return unregister
		}},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			m, err := nvmlsim.New("dgxh100")
			f := guardFixture{machine: m}
			f.must(t, err)
			if ret := m.Init(); ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			t.Cleanup(func() { m.Shutdown() })
			f.claim = prepared()
			f.claim.Pods = []checkpoint.ReservedPod{{Name: "p", UID: "pod-1"}}
			f.claim.Devices[0].UUIDs = []string{m.GPUUUID(0)}
			f.engine = &engine{claims: []checkpoint.PreparedClaim{f.claim}}
			f.client = apiserver.NodeClient(node) // the ResourceClaim is deleted
			clock := clocktesting.NewFakePassiveClock(time.Unix(1e9, 0))
			f.opts = &Options{Client: f.client, Engine: f.engine, DriverName: driver, PoolName: node, NodeName: node,
				GracePeriod: grace, Clock: clock, NVML: m, ProcRoot: t.TempDir()}
			end := tc.setup(t, &f)
			r, err := New(*f.opts)
			f.must(t, err)
			reg := metrics.NewKubeRegistry()
			r.Metrics().MustRegister(reg)

			r.Check(ctx)
			clock.SetTime(clock.Now().Add(grace))
			for range 2 { // the second check must not record the hold again
				r.Check(ctx)
			}
			if tc.wantHeld == "" {
				if len(f.engine.released) != 1 {
					t.Fatalf("not released without evidence of a user")
				}
				return
			}
			if len(f.engine.released) != 0 {
				t.Fatalf("released while %s", tc.wantHeld)
			}
			if got := gauge(t, reg, tc.wantHeld); got != 1 {
				t.Errorf("stale_claims_held{reason=%s} = %v, want 1", tc.wantHeld, got)
			}
			if held := events(t, f.client, HeldEventReason); len(held) != 1 || !strings.Contains(held[0], "uid-1") || !strings.Contains(held[0], tc.wantHeld) {
				t.Errorf("hold events %q, want one naming uid-1 and %s", held, tc.wantHeld)
			}

			end()
			r.Check(ctx)
			if len(f.engine.released) != 1 {
				t.Fatalf("still held once the evidence is gone")
			}
			if got := gauge(t, reg, tc.wantHeld); got != 0 {
				t.Errorf("stale_claims_held{reason=%s} = %v after the release, want 0", tc.wantHeld, got)
			}
			if released := events(t, f.client, EventReason); len(released) != 1 {
				t.Errorf("release events %q, want 1", released)
			}
		})
	}
}

// mpsShare makes the stale claim's device an MPS share.
func (f *guardFixture) mpsShare() {
	f.engine.claims[0].Devices[0].Kind = vocabulary.KindMPS
	f.engine.claims[0].Devices[0].ShareID = "s1"
}

// kubelet serves the PodResources API the Releaser asks.
func (f *guardFixture) kubelet(t *testing.T) *kubelet.PodResources {
	dir, err := os.MkdirTemp("", "pr") // a unix socket path must be short
	f.must(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	f.opts.PodResourcesSocket = filepath.Join(dir, "kubelet.sock")
	k, err := kubelet.ServePodResources(f.opts.PodResourcesSocket)
	f.must(t, err)
	t.Cleanup(k.Stop)
	return k
}

// share puts another claim, recorded for the pod of UID owner, on the
// stale claim's GPU, and a process of pod 3e9a1c2b-… on it.
func (f *guardFixture) share(t *testing.T, owner types.UID) func() {
	other := prepared()
	other.UID, other.Name = "uid-9", "other"
	other.Devices[0].UUIDs = f.claim.Devices[0].UUIDs
	other.Pods = []checkpoint.ReservedPod{{Name: "q", UID: owner}}
	f.engine.claims = append(f.engine.claims, other)
	live := claim(other.UID, node) // allocated here: not stale
	live.Name = other.Name
	f.must(t, f.client.Tracker().Add(live))
	const pid = 4243
	dir := filepath.Join(f.opts.ProcRoot, "4243")
	f.must(t, os.MkdirAll(dir, 0o755))
	f.must(t, os.WriteFile(filepath.Join(dir, "cgroup"), []byte("0::/kubepods/burstable/pod3e9a1c2b-7f4d-4c1e-9b2a-5d6e7f8a9b0c/8f1c2d3e4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff\n"), 0o644))
	unregister, err := f.machine.RegisterProcess(pid, nvmlsim.Registration{Devices: f.claim.Devices[0].UUIDs, SMPercent: 10})
	f.must(t, err)
	return unregister
}

func events(t *testing.T, client *fake.Clientset, reason string) []string {
	t.Helper()
	out, err := apiserver.NodeEventMessages(t.Context(), client, node, reason)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// gauge reads gpu_dra_plugin_stale_claims_held{reason}.
func gauge(t *testing.T, reg metrics.Gatherer, reason string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "gpu_dra_plugin_stale_claims_held" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no stale_claims_held{reason=%s}", reason)
	return 0
}
