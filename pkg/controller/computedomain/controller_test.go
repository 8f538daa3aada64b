package computedomain

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/opaqueconfig"
)

func (e *env) claim(t *testing.T, name string) *resourceapi.ResourceClaim {
	t.Helper()
	c, err := e.client.ResourceV1().ResourceClaims(ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func condition(t *testing.T, cd *gpuv1beta1.ComputeDomain, typ string) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(cd.Status.Conditions, typ)
	if c == nil {
		t.Fatalf("no %s condition in %+v", typ, cd.Status.Conditions)
	}
	return *c
}

func TestCreatesChannelClaim(t *testing.T) {
	e := newEnv(t, nil, domain("training"))
	e.sync(t, "training")
	got := e.claim(t, "training-channel")
	want := `{"metadata":{"name":"training-channel","namespace":"team","ownerReferences":[{"apiVersion":"gpu.dra.dev/v1beta1","kind":"ComputeDomain","name":"training","uid":"uid-training","controller":true,"blockOwnerDeletion":false}]},` +
		`"spec":{"devices":{"requests":[{"name":"channel","exactly":{"deviceClassName":"imex-channel.gpu.dra.dev",` +
		`"selectors":[{"cel":{"expression":"device.attributes[\"gpu.dra.dev\"].channel == 0"}}],"allocationMode":"ExactCount","count":1}}],` +
		`"config":[{"requests":["channel"],"opaque":{"driver":"gpu.dra.dev","parameters":{"kind":"ComputeDomainChannelConfig","apiVersion":"gpu.dra.dev/v1beta1","domainName":"training"}}}]}},"status":{}}`
	got.TypeMeta, got.ResourceVersion, got.CreationTimestamp, got.ManagedFields = metav1.TypeMeta{}, "", metav1.Time{}, nil
	if diff := cmp.Diff(want, string(mustJSON(t, got))); diff != "" {
		t.Errorf("claim (-want +got):\n%s", diff)
	}
	// The webhook and the nodes' plugins decode the config as the driver's.
	if _, err := opaqueconfig.DecodeDefaultValidate(got.Spec.Devices.Config[0].Opaque.Parameters.Raw); err != nil {
		t.Errorf("the claim's config does not decode: %v", err)
	}
	if k := e.get(t, "training").Status.Channel; k == nil || *k != 0 {
		t.Errorf("status.channel %v, want 0 (the claim's selector)", k)
	}
	if c := condition(t, e.get(t, "training"), ConditionReady); c.Reason != ReasonNoNodes || c.Status != metav1.ConditionFalse {
		t.Errorf("Ready %+v, want False NoNodes", c)
	}
	// Idempotent: a second sync changes nothing.
	rv := e.claim(t, "training-channel").ResourceVersion
	e.sync(t, "training")
	if e.claim(t, "training-channel").ResourceVersion != rv {
		t.Error("second sync rewrote the claim")
	}
}

func mustJSON(t *testing.T, obj runtime.Object) []byte {
	t.Helper()
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestInvalidDomain(t *testing.T) {
	e := newEnv(t, nil, domain("bad", func(cd *gpuv1beta1.ComputeDomain) {
		cd.Spec.Channel.AllocationMode = "All"
		cd.Spec.Lifetime = &gpuv1beta1.ComputeDomainLifetime{Policy: gpuv1beta1.LifetimeWithOwner, GracePeriodSeconds: ptr.To[int32](5)}
	}))
	e.sync(t, "bad")
	c := condition(t, e.get(t, "bad"), ConditionReady)
	if c.Reason != ReasonInvalid || !contains(c.Message, "spec.channel.allocationMode") || !contains(c.Message, "spec.lifetime.gracePeriodSeconds") {
		t.Errorf("Ready %+v, want Invalid naming both fields", c)
	}
	if _, err := e.client.ResourceV1().ResourceClaims(ns).Get(e.ctx, "bad-channel", metav1.GetOptions{}); err == nil {
		t.Error("a claim was created for an invalid domain")
	}
}

func TestForeignClaimConflict(t *testing.T) {
	foreign := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "training-channel", Namespace: ns, UID: "theirs"}}
	e := newEnv(t, []runtime.Object{foreign}, domain("training"))
	e.sync(t, "training")
	c := condition(t, e.get(t, "training"), ConditionReady)
	if c.Reason != ReasonClaimConflict || !contains(c.Message, "team/training-channel") {
		t.Errorf("Ready %+v, want ClaimConflict naming the claim", c)
	}
	if got := e.claim(t, "training-channel"); len(got.OwnerReferences) != 0 || len(got.Spec.Devices.Requests) != 0 {
		t.Errorf("the foreign claim was touched: %+v", got)
	}
}

func node(name string, state gpuv1beta1.DaemonState, unreachable ...string) gpuv1beta1.ComputeDomainNode {
	return gpuv1beta1.ComputeDomainNode{Name: name, Daemon: gpuv1beta1.DaemonStatus{State: state, UnreachablePeers: unreachable}}
}

func TestReadyCondition(t *testing.T) {
	for name, tc := range map[string]struct {
		nodes      []gpuv1beta1.ComputeDomainNode
		status     metav1.ConditionStatus
		reason     string
		messageHas []string
	}{
		"no nodes":      {status: metav1.ConditionFalse, reason: ReasonNoNodes},
		"all connected": {nodes: []gpuv1beta1.ComputeDomainNode{node("a", "Connected"), node("b", "Connected")}, status: metav1.ConditionTrue, reason: ReasonConnected},
		"one starting":  {nodes: []gpuv1beta1.ComputeDomainNode{node("a", "Connected"), node("b", "Starting")}, status: metav1.ConditionFalse, reason: ReasonDaemonStarting, messageHas: []string{"b"}},
		"disconnected": {nodes: []gpuv1beta1.ComputeDomainNode{node("a", "Disconnected", "b"), node("b", "Connected")},
			status: metav1.ConditionFalse, reason: ReasonDaemonDisconnected, messageHas: []string{"a (cannot reach b)"}},
		"failed wins":  {nodes: []gpuv1beta1.ComputeDomainNode{node("a", "Disconnected", "b"), node("b", "Failed")}, status: metav1.ConditionFalse, reason: ReasonDaemonFailed, messageHas: []string{"b"}},
		"no state yet": {nodes: []gpuv1beta1.ComputeDomainNode{node("a", "")}, status: metav1.ConditionFalse, reason: ReasonDaemonStarting},
	} {
		t.Run(name, func(t *testing.T) {
			c := readyCondition(tc.nodes)
			if c.Status != tc.status || c.Reason != tc.reason {
				t.Errorf("%s %s (%s), want %s %s", c.Status, c.Reason, c.Message, tc.status, tc.reason)
			}
			for _, s := range tc.messageHas {
				if !contains(c.Message, s) {
					t.Errorf("message %q lacks %q", c.Message, s)
				}
			}
		})
	}
}

// reserve makes the claim reserved for pods on nodes (pod i on nodes[i]).
func (e *env) reserve(t *testing.T, claimName string, nodes ...string) {
	t.Helper()
	claim := e.claim(t, claimName)
	claim.Status.ReservedFor = nil
	for i, n := range nodes {
		name := "worker-" + string(rune('0'+i))
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: k8sUID(name)}, Spec: corev1.PodSpec{NodeName: n}}
		if _, err := e.client.CoreV1().Pods(ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil && !isExists(err) {
			t.Fatal(err)
		}
		claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: name, UID: pod.UID})
	}
	if _, err := e.client.ResourceV1().ResourceClaims(ns).UpdateStatus(e.ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// report writes node entries as the nodes' plugins do.
func (e *env) report(t *testing.T, name string, nodes ...gpuv1beta1.ComputeDomainNode) {
	t.Helper()
	for _, n := range nodes {
		patch := applyObject(domain(name))
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&n)
		if err != nil {
			t.Fatal(err)
		}
		patch.Object["status"] = map[string]any{"nodes": []any{m}}
		if _, err := e.dyn.Resource(gpuv1beta1.ComputeDomainResource).Namespace(ns).ApplyStatus(e.ctx, name, patch,
			metav1.ApplyOptions{FieldManager: NodeFieldManager(n.Name), Force: true}); err != nil {
			t.Fatal(err)
		}
	}
}

func nodeNames(cd *gpuv1beta1.ComputeDomain) []string {
	var out []string
	for _, n := range cd.Status.Nodes {
		out = append(out, n.Name)
	}
	return out
}

func TestReadyAndPruning(t *testing.T) {
	e := newEnv(t, nil, domain("training"))
	e.sync(t, "training")
	e.reserve(t, "training-channel", "tray-1", "tray-2")
	e.report(t, "training", node("tray-1", "Connected"), node("tray-2", "Connected"))
	e.sync(t, "training")
	if c := condition(t, e.get(t, "training"), ConditionReady); c.Status != metav1.ConditionTrue {
		t.Fatalf("Ready %+v, want True", c)
	}

	// tray-2's pod is gone and tray-2 died without removing its entry; tray-1
	// cannot reach it.
	e.reserve(t, "training-channel", "tray-1")
	e.report(t, "training", node("tray-1", "Disconnected", "tray-2"))
	after := e.sync(t, "training")
	cd := e.get(t, "training")
	if c := condition(t, cd, ConditionReady); c.Reason != ReasonDaemonDisconnected || !contains(c.Message, "tray-1 (cannot reach tray-2)") {
		t.Errorf("Ready %+v, want DaemonDisconnected naming tray-1 and tray-2", c)
	}
	if got := nodeNames(cd); len(got) != 2 || after <= 0 || after > time.Minute {
		t.Fatalf("nodes %v, look again after %v: want both kept within the grace period, a minute", got, after)
	}
	e.now = e.now.Add(time.Minute)
	e.sync(t, "training")
	if got := nodeNames(e.get(t, "training")); !cmp.Equal(got, []string{"tray-1"}) {
		t.Errorf("nodes %v after the grace period, want [tray-1]", got)
	}
}
