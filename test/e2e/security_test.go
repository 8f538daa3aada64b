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
)

// nodeNameExtra is the user extra a pod-bound service account token carries.
const nodeNameExtra = "authentication.kubernetes.io/node-name"

// pluginClient is a client that acts as the plugin's service account, with the
// credential of a pod on node (empty: a token bound to no node).
func pluginClient(t *testing.T, node string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(env.cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + env.namespace + ":" + env.pluginSA}
	cfg.Impersonate.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + env.namespace, "system:authenticated"}
	if node != "" {
		cfg.Impersonate.Extra = map[string][]string{nodeNameExtra: {node}}
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
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
// control daemon pods, bound to its own node and running the driver's image
// (ValidatingAdmissionPolicy), and only in the driver's namespace (RBAC).
func TestMPSDaemonPodPolicy(t *testing.T) {
	ctx := testContext(t)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	image := pluginPod(t, ctx).Spec.Containers[0].Image
	daemonPod := func(node, image string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-mps-", Labels: labels},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: image}}},
		}
	}
	daemon := map[string]string{"app.kubernetes.io/component": "mps-control-daemon"}
	own := pluginClient(t, env.node).CoreV1().Pods(env.namespace)
	if _, err := own.Create(ctx, daemonPod(env.node, image, daemon), dryRun); err != nil {
		t.Errorf("the plugin may not create an MPS daemon pod on its own node: %v", err)
	}
	_, err := own.Create(ctx, daemonPod("some-other-node", image, daemon), dryRun)
	expectDenied(t, err, "may only manage pods bound to its own node", "create a daemon pod on another node")
	_, err = own.Create(ctx, daemonPod(env.node, "registry.example/miner:latest", daemon), dryRun)
	expectDenied(t, err, "must run the driver's image", "create a daemon pod of another image")
	_, err = own.Create(ctx, daemonPod(env.node, image, nil), dryRun)
	expectDenied(t, err, "may only manage MPS control daemon pods", "create a pod that is no MPS daemon")
	if _, err := pluginClient(t, env.node).CoreV1().Pods("default").Create(ctx, daemonPod(env.node, image, daemon), dryRun); !apierrors.IsForbidden(err) {
		t.Errorf("the plugin may create pods outside its namespace: %v", err)
	}
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
