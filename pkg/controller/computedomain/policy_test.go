package computedomain

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/internal/vaptest"
)

const (
	pluginUser     = "system:serviceaccount:gpu:rel-gpu-dra-driver-kubelet-plugin"
	controllerUser = "system:serviceaccount:gpu:rel-gpu-dra-driver-controller"
)

func (e *env) object(t *testing.T, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := e.dyn.Resource(gpuv1beta1.ComputeDomainResource).Namespace(ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// withNodes returns a copy of u whose status.nodes are nodes.
func withNodes(t *testing.T, u *unstructured.Unstructured, nodes ...gpuv1beta1.ComputeDomainNode) *unstructured.Unstructured {
	t.Helper()
	out := u.DeepCopy()
	list := []any{}
	for _, n := range nodes {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&n)
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, m)
	}
	if err := unstructured.SetNestedSlice(out.Object, list, "status", "nodes"); err != nil {
		t.Fatal(err)
	}
	return out
}

// withStatusChannel returns a copy of u whose status.channel is k.
func withStatusChannel(t *testing.T, u *unstructured.Unstructured, k int64) *unstructured.Unstructured {
	t.Helper()
	out := u.DeepCopy()
	if err := unstructured.SetNestedField(out.Object, k, "status", "channel"); err != nil {
		t.Fatal(err)
	}
	return out
}

func withIP(n gpuv1beta1.ComputeDomainNode, ip string) gpuv1beta1.ComputeDomainNode {
	n.IPAddress = ip
	return n
}

// TestStatusPolicy evaluates the chart's policy on ComputeDomain status
// writes with the API server's CEL code: the status writes the controller
// and the nodes' plugins make are admitted; a node writing another node's
// entry, the controller adding or changing an entry, and anyone else
// changing status.nodes are denied.
func TestStatusPolicy(t *testing.T) {
	out, err := vaptest.Render(t, "../../../deployments/helm/gpu-dra-driver", "rel", "gpu", "templates/computedomain-admissionpolicy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spec := vaptest.Find(t, out, "-computedomain-status")
	if r := spec.Spec.MatchConstraints.ResourceRules; len(r) != 1 || !slices.Equal(r[0].Resources, []string{"computedomains/status"}) ||
		!slices.Equal(r[0].APIGroups, []string{gpuv1beta1.GroupVersion.Group}) {
		t.Fatalf("the policy matches %+v, want the status of ComputeDomains", r)
	}
	policy := vaptest.Compile(t, spec)

	// The writes of the real controller: conditions, then pruning tray-2.
	e := newEnv(t, nil, domain("training"))
	e.sync(t, "training")
	e.reserve(t, "training-channel", "tray-1")
	a, b := node("tray-1", "Connected"), node("tray-2", "Starting")
	a.IPAddress, b.IPAddress = "10.0.0.1", "10.0.0.2"
	e.report(t, "training", a, b)
	beforeConditions := e.object(t, "training")
	e.sync(t, "training")
	withConditions := e.object(t, "training")
	if !slices.Equal(nodeNames(e.get(t, "training")), []string{"tray-1", "tray-2"}) {
		t.Fatal("setup: want both entries")
	}
	e.now = e.now.Add(time.Hour)
	e.sync(t, "training")
	pruned := e.object(t, "training")
	if !slices.Equal(nodeNames(e.get(t, "training")), []string{"tray-1"}) {
		t.Fatal("setup: want tray-2 pruned")
	}
	base := withConditions // both entries, the controller's conditions
	noStatus := toUnstructured(t, domain("new"))
	delete(noStatus.Object, "status")

	onNode := func(node string) user.Info {
		return &user.DefaultInfo{Name: pluginUser, Extra: map[string][]string{"authentication.kubernetes.io/node-name": {node}}}
	}
	tenant := &user.DefaultInfo{Name: "alice", Groups: []string{"system:authenticated"}}
	for name, tc := range map[string]struct {
		who      user.Info
		old, obj *unstructured.Unstructured
		denied   string // "" admitted
	}{
		"plugin updates its entry":     {who: onNode("tray-1"), old: base, obj: withNodes(t, base, node("tray-1", "Disconnected", "tray-2"), b)},
		"plugin adds its entry":        {who: onNode("tray-3"), old: base, obj: withNodes(t, base, a, b, node("tray-3", "Starting"))},
		"plugin drops its entry":       {who: onNode("tray-2"), old: base, obj: withNodes(t, base, a)},
		"plugin changes another entry": {who: onNode("tray-1"), old: base, obj: withNodes(t, base, a, withIP(b, "192.0.2.66")), denied: "the kubelet plugin on node tray-1 may only write its own entry of status.nodes, not the entries of tray-2"},
		"plugin adds another entry":    {who: onNode("tray-1"), old: base, obj: withNodes(t, base, a, b, node("tray-9", "Connected")), denied: "not the entries of tray-9"},
		"plugin drops another entry":   {who: onNode("tray-1"), old: base, obj: withNodes(t, base, a), denied: "not the entries of tray-2"},
		"plugin without a node":        {who: &user.DefaultInfo{Name: pluginUser}, old: base, obj: withNodes(t, base, a), denied: "the credential names no node"},
		"plugin writes conditions":     {who: onNode("tray-1"), old: beforeConditions, obj: withConditions, denied: "may not change the status conditions"},
		"controller writes conditions": {who: &user.DefaultInfo{Name: controllerUser}, old: beforeConditions, obj: withConditions},
		"controller prunes":            {who: &user.DefaultInfo{Name: controllerUser}, old: withConditions, obj: pruned},
		"controller adds an entry":     {who: &user.DefaultInfo{Name: controllerUser}, old: pruned, obj: withNodes(t, pruned, a, b), denied: "the controller may only remove entries of status.nodes (pruning), not add or change the entries of tray-2"},
		"controller changes an entry":  {who: &user.DefaultInfo{Name: controllerUser}, old: pruned, obj: withNodes(t, pruned, withIP(a, "192.0.2.66")), denied: "not add or change the entries of tray-1"},
		"tenant adds an entry":         {who: tenant, old: base, obj: withNodes(t, base, a, b, withIP(node("tray-9", "Connected"), "192.0.2.66")), denied: "this request changes the entries of tray-9"},
		"tenant changes an address":    {who: tenant, old: base, obj: withNodes(t, base, withIP(a, "192.0.2.66"), b), denied: "this request changes the entries of tray-1"},
		"tenant removes an entry":      {who: tenant, old: base, obj: withNodes(t, base, a), denied: "changes the entries of tray-2"},
		// Conditions are not the policy's: the controller does not trust
		// them (TestAfterLastPodForgedCondition).
		"tenant writes conditions":              {who: tenant, old: beforeConditions, obj: withConditions},
		"tenant reorders entries":               {who: tenant, old: base, obj: withNodes(t, base, b, a)},
		"tenant on a domain without status":     {who: tenant, old: noStatus, obj: noStatus},
		"plugin adds its entry to a new domain": {who: onNode("tray-1"), old: noStatus, obj: withNodes(t, noStatus, a)},
		// status.channel: the controller reserves it once; nobody changes it.
		"controller reserves a channel": {who: &user.DefaultInfo{Name: controllerUser}, old: noStatus, obj: withStatusChannel(t, noStatus, 3)},
		"controller changes the channel": {who: &user.DefaultInfo{Name: controllerUser}, old: base, obj: withStatusChannel(t, base, 3),
			denied: "only the controller sets it, once; this request changes it from 0 to 3"},
		"tenant sets a channel":      {who: tenant, old: noStatus, obj: withStatusChannel(t, noStatus, 3), denied: "changes it from -1 to 3"},
		"tenant changes the channel": {who: tenant, old: base, obj: withStatusChannel(t, base, 5), denied: "changes it from 0 to 5"},
		"plugin changes the channel": {who: onNode("tray-1"), old: base, obj: withStatusChannel(t, base, 5), denied: "changes it from 0 to 5"},
	} {
		t.Run(name, func(t *testing.T) {
			matched, denied := policy.Admit(t, vaptest.Request{Operation: admission.Update, Object: tc.obj, OldObject: tc.old,
				Namespace: ns, Name: tc.obj.GetName(), User: tc.who,
				Kind: gpuv1beta1.GroupVersion.WithKind(gpuv1beta1.ComputeDomainKind), Resource: gpuv1beta1.ComputeDomainResource})
			if !matched {
				t.Fatal("the policy does not match")
			}
			if tc.denied == "" && denied != "" || !strings.Contains(denied, tc.denied) {
				t.Errorf("denied %q, want %q", denied, tc.denied)
			}
		})
	}
}
