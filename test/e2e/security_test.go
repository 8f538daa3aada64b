package e2e

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/mpspod/mpspodtest"
)

// nodeNameExtra is the user extra a pod-bound service account token carries.
const nodeNameExtra = "authentication.kubernetes.io/node-name"

// pluginClient is a client that acts as the plugin's service account, with the
// credential of a pod on node (empty: a token bound to no node).
func pluginClient(t *testing.T, node string) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(pluginConfig(node))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// pluginConfig is the client config of pluginClient.
func pluginConfig(node string) *rest.Config {
	cfg := rest.CopyConfig(env.cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + env.namespace + ":" + env.pluginSA}
	cfg.Impersonate.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + env.namespace, "system:authenticated"}
	if node != "" {
		cfg.Impersonate.Extra = map[string][]string{nodeNameExtra: {node}}
	}
	return cfg
}

func slice(name, node string) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driverName,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices:  []resourceapi.Device{{Name: "intruder"}},
		},
	}
}

// TestCrossNodeSliceWriteDenied: the plugin's service account may write only
// ResourceSlices of the node its credential names (ValidatingAdmissionPolicy).
func TestCrossNodeSliceWriteDenied(t *testing.T) {
	ctx := testContext(t)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	own := pluginClient(t, env.node)

	// Its own node: allowed (dry run, nothing is published).
	if _, err := own.ResourceV1().ResourceSlices().Create(ctx, slice("e2e-own", env.node), dryRun); err != nil {
		t.Errorf("the plugin may not create a slice of its own node %s: %v", env.node, err)
	}
	// Another node: denied.
	_, err := own.ResourceV1().ResourceSlices().Create(ctx, slice("e2e-other", "some-other-node"), dryRun)
	expectDenied(t, err, "may only write ResourceSlices of its own node", "create a slice of another node")
	// A token bound to no node: denied.
	_, err = pluginClient(t, "").ResourceV1().ResourceSlices().Create(ctx, slice("e2e-none", env.node), dryRun)
	expectDenied(t, err, "names no node", "create a slice without a node credential")

	// Updating or deleting another node's existing slice: denied.
	admin := env.cluster.Client.ResourceV1().ResourceSlices()
	other, err := admin.Create(ctx, slice("e2e-other-node-slice", "some-other-node"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create another node's slice as admin: %v", err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), other.Name, metav1.DeleteOptions{}) })
	err = own.ResourceV1().ResourceSlices().Delete(ctx, other.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	expectDenied(t, err, "may only write ResourceSlices of its own node", "delete another node's slice")
	// Moving it to its own node is an update of another node's slice: denied.
	moved := other.DeepCopy()
	moved.Spec.NodeName = ptr.To(env.node)
	moved.Spec.Pool.Name = env.node
	_, err = own.ResourceV1().ResourceSlices().Update(ctx, moved, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
	if err == nil || !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("update of another node's slice to its own node: want denied, got %v", err)
	}

	// RBAC: nothing beyond what it needs, e.g. no reading Secrets.
	if _, err := own.CoreV1().Secrets(env.namespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the plugin's service account may list Secrets: %v", err)
	}
}

// TestMPSDaemonPodPolicy: the plugin's service account may create only MPS
// control daemon pods of exactly the launcher's shape, bound to its own node
// (ValidatingAdmissionPolicy), and only in the driver's namespace (RBAC).
// The launcher's real pod, resubmitted with the plugin's identity, is
// admitted; each forbidden variant of it is denied with a message saying why.
func TestMPSDaemonPodPolicy(t *testing.T) {
	ctx := testContext(t)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	good := launcherPod(t, ctx)
	own := pluginClient(t, env.node).CoreV1().Pods(env.namespace)
	if _, err := own.Create(ctx, good.DeepCopy(), dryRun); err != nil {
		t.Fatalf("the plugin may not create the launcher's own MPS daemon pod: %v", err)
	}
	other := good.DeepCopy()
	other.Spec.NodeName = "some-other-node"
	_, err := own.Create(ctx, other, dryRun)
	expectDenied(t, err, "may only manage pods bound to its own node", "create a daemon pod on another node")
	for name, v := range mpspodtest.ForbiddenVariants(good, env.pluginSA) {
		t.Run(name, func(t *testing.T) {
			pod := good.DeepCopy()
			v.Mutate(pod)
			_, err := own.Create(ctx, pod, dryRun)
			expectDenied(t, err, v.Want, name)
		})
	}
	if _, err := pluginClient(t, env.node).CoreV1().Pods("default").Create(ctx, good.DeepCopy(), dryRun); !apierrors.IsForbidden(err) {
		t.Errorf("the plugin may create pods outside its namespace: %v", err)
	}
}

// launcherPod is an MPS control daemon pod the plugin created (for a share
// this test prepares), as the plugin would submit it again: without what the
// API server filled in.
func launcherPod(t *testing.T, ctx context.Context) *corev1.Pod {
	t.Helper()
	ns := newNamespace(t, ctx, "e2e-mps-policy")
	claimTemplate(t, ctx, ns, "mps", resourceapi.ExactDeviceRequest{DeviceClassName: "mps." + driverName})
	claimPod(t, ctx, ns, "mps", "mps")
	pods, err := env.cluster.Client.CoreV1().Pods(env.namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/component=mps-control-daemon", FieldSelector: "spec.nodeName=" + env.node,
	})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("no MPS control daemon pod on %s after preparing an MPS share: %v", env.node, err)
	}
	daemon := pods.Items[0]
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: daemon.GenerateName, Labels: daemon.Labels, Annotations: daemon.Annotations, OwnerReferences: daemon.OwnerReferences,
		},
		Spec: *daemon.Spec.DeepCopy(),
	}
	// The Priority admission plugin sets the priority from the class.
	pod.Spec.Priority = nil
	return pod
}

func expectDenied(t *testing.T, err error, message, what string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: allowed, want denied by the admission policy", what)
		return
	}
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), message) {
		t.Errorf("%s: %v, want Forbidden with %q", what, err, message)
	}
}
