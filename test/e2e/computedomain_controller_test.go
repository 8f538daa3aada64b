package e2e

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// controllerClient acts as the controller's service account.
func controllerClient(t *testing.T, ctx context.Context) kubernetes.Interface {
	t.Helper()
	sa := controllerDeployment(t, ctx).Spec.Template.Spec.ServiceAccountName
	cfg := rest.CopyConfig(env.cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + env.namespace + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + env.namespace, "system:authenticated"}}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestControllerChannelSliceWrites: the controller's service account may
// write the IMEX channel pools and no other ResourceSlice
// (ValidatingAdmissionPolicy <fullname>-controller-resourceslices).
func TestControllerChannelSliceWrites(t *testing.T) {
	ctx := testContext(t)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	c := controllerClient(t, ctx).ResourceV1().ResourceSlices()
	channels := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-channels"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: driverName,
			Pool:   resourceapi.ResourcePool{Name: vocabulary.ChannelPoolName("e2e.1"), Generation: 1, ResourceSliceCount: 1},
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: vocabulary.LabelClique, Operator: corev1.NodeSelectorOpIn, Values: []string{"e2e.1"},
			}}}}},
			Devices: []resourceapi.Device{{Name: vocabulary.ChannelDeviceName(0)}},
		},
	}
	if _, err := c.Create(ctx, channels, dryRun); err != nil {
		t.Errorf("the controller may not create a channel slice: %v", err)
	}
	_, err := c.Create(ctx, slice("e2e-node", env.node), dryRun)
	expectDenied(t, err, "may only write the IMEX channel pools", "the controller creates a node's slice")
	allNodes := channels.DeepCopy()
	allNodes.Spec.NodeSelector, allNodes.Spec.AllNodes = nil, ptr.To(true)
	_, err = c.Create(ctx, allNodes, dryRun)
	expectDenied(t, err, "may only write the IMEX channel pools", "the controller creates a slice for all nodes")
}

// TestComputeDomainChannelClaim: dra-controller creates a ComputeDomain's
// shared channel claim, owned by the domain, reports NoNodes before any
// pod, and ClaimConflict (leaving the claim alone) when a claim of the name
// is someone else's.
func TestComputeDomainChannelClaim(t *testing.T) {
	ctx := testContext(t)
	ns := newNamespace(t, ctx, "e2e-computedomain")
	dyn, err := dynamic.NewForConfig(env.cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	domains := dyn.Resource(gpuv1beta1.ComputeDomainResource).Namespace(ns)
	create := func(name, claim string) {
		t.Helper()
		cd := &gpuv1beta1.ComputeDomain{
			TypeMeta:   metav1.TypeMeta{APIVersion: gpuv1beta1.GroupVersion.String(), Kind: gpuv1beta1.ComputeDomainKind},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       gpuv1beta1.ComputeDomainSpec{Channel: gpuv1beta1.ComputeDomainChannel{ResourceClaimName: claim}},
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cd)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := domains.Create(ctx, &unstructured.Unstructured{Object: m}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ComputeDomain %s: %v", name, err)
		}
	}
	ready := func(name string) *metav1.Condition {
		u, err := domains.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		var cd gpuv1beta1.ComputeDomain
		if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cd) != nil {
			return nil
		}
		return meta.FindStatusCondition(cd.Status.Conditions, "Ready")
	}
	claims := env.cluster.Client.ResourceV1().ResourceClaims(ns)

	create("training", "training-channel")
	var claim *resourceapi.ResourceClaim
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		claim, err = claims.Get(ctx, "training-channel", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("no channel claim: %v", err)
	}
	if ref := metav1.GetControllerOf(claim); ref == nil || ref.Kind != gpuv1beta1.ComputeDomainKind || ref.Name != "training" {
		t.Errorf("claim controller %+v, want ComputeDomain training", ref)
	}
	if r := claim.Spec.Devices.Requests; len(r) != 1 || r[0].Exactly == nil || r[0].Exactly.DeviceClassName != "imex-channel."+driverName || r[0].Exactly.Count != 1 {
		t.Errorf("claim requests %+v, want one imex-channel device", r)
	}
	if err := poll(ctx, func(context.Context) (bool, error) {
		c := ready("training")
		return c != nil && c.Reason == "NoNodes", nil
	}); err != nil {
		t.Errorf("Ready %+v, want NoNodes: %v", ready("training"), err)
	}

	foreign := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "taken"}, Spec: claim.Spec}
	if _, err := claims.Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	create("conflict", "taken")
	if err := poll(ctx, func(context.Context) (bool, error) {
		c := ready("conflict")
		return c != nil && c.Reason == "ClaimConflict", nil
	}); err != nil {
		t.Errorf("Ready %+v, want ClaimConflict: %v", ready("conflict"), err)
	}
	if got, err := claims.Get(ctx, "taken", metav1.GetOptions{}); err != nil || len(got.OwnerReferences) != 0 {
		t.Errorf("the foreign claim was touched: %v %+v", err, got)
	}

	// Deleting the domain deletes its claim (garbage collection).
	if err := domains.Delete(ctx, "training", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		_, err := claims.Get(ctx, "training-channel", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Errorf("channel claim not deleted with its domain: %v", err)
	}
}
