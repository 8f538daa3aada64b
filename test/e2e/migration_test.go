package e2e

// Moving off NVIDIA's device plugin (docs/migration.md): pod specs written for
// the device plugin run unchanged through DRA extended resources and count
// against ResourceQuota on the same names, and the plugin withdraws its
// devices from a node where a (stand-in) device plugin registers with the
// real kubelet.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/deviceplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/coexistence"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/modelclasses"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// migProfile is a MIG profile of the e2e machine (dgxh100: H100 80GB).
const migProfile = "1g.10gb"

// devicePluginPod is a pod as written for the device plugin: one container
// with `limits: {<resource>: 1}` and nothing DRA.
func devicePluginPod(ns, name, resourceName string) *corev1.Pod {
	one := corev1.ResourceList{corev1.ResourceName(resourceName): resource.MustParse("1")}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "ctr", Image: "gdd.local/demo:v1", ImagePullPolicy: corev1.PullIfNotPresent,
				Command:   []string{"sleep", "86400"},
				Resources: corev1.ResourceRequirements{Limits: one},
			}},
		},
	}
}

// runDevicePluginPod creates the pod, waits until it runs and returns the one
// device of the claim the scheduler made for its extended resource.
func runDevicePluginPod(t *testing.T, ctx context.Context, ns, name, resourceName string) scenarios.DeviceReport {
	t.Helper()
	if _, err := env.cluster.Client.CoreV1().Pods(ns).Create(ctx, devicePluginPod(ns, name, resourceName), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s asking for %s: %v", ns, name, resourceName, err)
	}
	if err := env.runner.WaitPodRunning(ctx, ns, name); err != nil {
		evs, _ := env.runner.PodEvents(ctx, ns, name)
		t.Fatalf("%s: %v; events: %s", resourceName, err, strings.Join(evs, "; "))
	}
	rep, err := env.runner.InspectPod(ctx, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Claims) != 1 || !rep.Claims[0].Extended || len(rep.Claims[0].Devices) != 1 {
		t.Fatalf("pod %s (%s): want one extended-resource claim with one device, have %+v", name, resourceName, rep.Claims)
	}
	return rep.Claims[0].Devices[0]
}

// Every device plugin name, served by its DeviceClass, gives the device kind
// the device plugin would, and a ResourceQuota of 1 on each name admits one
// pod and refuses the second. Then the cluster makes nvidia.com/gpu mean a
// time-slicing share instead.
func TestMigrationDevicePluginNames(t *testing.T) {
	ctx := testContext(t)
	saveRelease(t, ctx)
	upgradeRelease(t, ctx, "--set", "extendedResources.timeslice="+vocabulary.ResourceGPUShared,
		"--set", "extendedResources.migProfiles={"+migProfile+"}")

	ns := newNamespace(t, ctx, "e2e-migration-names")
	cases := []struct {
		resource string
		kind     vocabulary.Kind
		profile  string
	}{
		{vocabulary.ResourceGPU, vocabulary.KindGPU, ""},
		{vocabulary.ResourceGPUShared, vocabulary.KindTimeSlice, ""},
		{vocabulary.MIGResourceName(migProfile), vocabulary.KindMIG, migProfile},
	}
	hard := corev1.ResourceList{}
	for _, c := range cases {
		hard[corev1.ResourceName("requests."+c.resource)] = resource.MustParse("1")
	}
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpus", Namespace: ns}, Spec: corev1.ResourceQuotaSpec{Hard: hard}}
	if _, err := env.cluster.Client.CoreV1().ResourceQuotas(ns).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Pods are admitted only once the quota controller computed the usage.
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		q, err := env.cluster.Client.CoreV1().ResourceQuotas(ns).Get(ctx, "gpus", metav1.GetOptions{})
		return err == nil && len(q.Status.Hard) == len(hard), nil
	}); err != nil {
		t.Fatalf("quota status not computed: %v", err)
	}

	for i, c := range cases {
		d := runDevicePluginPod(t, ctx, ns, fmt.Sprintf("pod-%d", i), c.resource)
		if d.Attributes[vocabulary.AttrType] != string(c.kind) || (c.profile != "" && d.Attributes[vocabulary.AttrProfile] != c.profile) {
			t.Errorf("%s got %s (type %s, profile %q), want a %s device %s", c.resource, d.Device,
				d.Attributes[vocabulary.AttrType], d.Attributes[vocabulary.AttrProfile], c.kind, c.profile)
		}
		_, err := env.cluster.Client.CoreV1().Pods(ns).Create(ctx, devicePluginPod(ns, fmt.Sprintf("over-quota-%d", i), c.resource), metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "exceeded quota") || !strings.Contains(err.Error(), c.resource) {
			t.Errorf("second pod asking for %s with a quota of 1: %v, want it refused for exceeded quota", c.resource, err)
		}
	}
	// The same quota covers claims written for DRA: a claim for the class
	// serving nvidia.com/gpu counts as requests.nvidia.com/gpu.
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "dra-claim", Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driverName},
		}}}},
	}
	_, err := env.cluster.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "exceeded quota") {
		t.Errorf("ResourceClaim for %s with the %s quota used up: %v, want it refused for exceeded quota", driverName, vocabulary.ResourceGPU, err)
	}
	q, err := env.cluster.Client.CoreV1().ResourceQuotas(ns).Get(ctx, "gpus", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name := range hard {
		if used := q.Status.Used[name]; used.Cmp(resource.MustParse("1")) != 0 {
			t.Errorf("quota used %s = %s, want 1", name, used.String())
		}
	}

	// The cluster decides what nvidia.com/gpu means: here, a share. The name
	// moves in two upgrades, each way (docs/migration.md: the scheduler's
	// extended-resource cache drops a name that one class loses while
	// another takes it): off the whole-GPU class, then onto the share class;
	// at the end off the share class (this cleanup runs before
	// saveRelease's), then back onto the whole-GPU class. Empty strings, not
	// null: with --reuse-values, helm keeps a value set to null.
	upgradeRelease(t, ctx, "--set", "extendedResourceName=", "--set", "extendedResources.timeslice=",
		"--set", "extendedResources.migProfiles=null")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		upgradeRelease(t, ctx, "--set", "extendedResources.timeslice=")
		dc, err := env.cluster.Client.ResourceV1().DeviceClasses().Get(ctx, "timeslice."+driverName, metav1.GetOptions{})
		switch {
		case err != nil:
			t.Error(err)
		case dc.Spec.ExtendedResourceName != nil:
			t.Errorf("the share class still has extended resource name %s before the whole-GPU class gets it back (a one-step move)", *dc.Spec.ExtendedResourceName)
		}
	})
	upgradeRelease(t, ctx, "--set", "extendedResources.timeslice="+vocabulary.ResourceGPU)
	ns2 := newNamespace(t, ctx, "e2e-migration-shared")
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		dc, err := env.cluster.Client.ResourceV1().DeviceClasses().Get(ctx, "timeslice."+driverName, metav1.GetOptions{})
		return err == nil && dc.Spec.ExtendedResourceName != nil && *dc.Spec.ExtendedResourceName == vocabulary.ResourceGPU, nil
	}); err != nil {
		t.Fatalf("timeslice class does not serve %s: %v", vocabulary.ResourceGPU, err)
	}
	d := runDevicePluginPod(t, ctx, ns2, "shared", vocabulary.ResourceGPU)
	if d.Attributes[vocabulary.AttrType] != string(vocabulary.KindTimeSlice) {
		t.Errorf("%s with extendedResources.timeslice=%[1]s got %s (type %s), want a time-slicing share", vocabulary.ResourceGPU, d.Device, d.Attributes[vocabulary.AttrType])
	}
}

// A device plugin registering nvidia.com/gpu with the node's real kubelet
// makes the plugin withdraw the node's ResourceSlices with a Warning event on
// the Node; once it is gone the plugin publishes them again.
func TestMigrationCoexistence(t *testing.T) {
	ctx := testContext(t)
	kubeletSock := pluginapi.KubeletSocket
	if env.nodeLocal != "" {
		// The local cluster: the node's /var/lib/kubelet is its kubelet dir.
		kubeletSock = filepath.Join(env.kubeletDir, "device-plugins", filepath.Base(pluginapi.KubeletSocket))
	}
	if _, err := os.Stat(kubeletSock); err != nil {
		t.Skipf("the kubelet's device-plugin socket %s is not on this machine (the test runs on the node): %v", kubeletSock, err)
	}
	before := len(nodeSlices(t, ctx, env.node))
	if before == 0 {
		t.Fatalf("no ResourceSlices of %s on node %s before the test", driverName, env.node)
	}
	since := time.Now().Add(-time.Second)

	dp, err := deviceplugin.Start(ctx, deviceplugin.Options{Dir: filepath.Dir(kubeletSock), ResourceName: vocabulary.ResourceGPU, Devices: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dp.Stop()
		// Leave the node publishing for the tests after this one.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := poll(ctx, func(ctx context.Context) (bool, error) { return len(nodeSlices(t, ctx, env.node)) == before, nil }); err != nil {
			t.Errorf("cleanup: node %s does not publish its %d ResourceSlices again: %v", env.node, before, err)
		}
	})
	waitAllocatable(t, ctx, 8)
	if err := poll(ctx, func(ctx context.Context) (bool, error) { return len(nodeSlices(t, ctx, env.node)) == 0, nil }); err != nil {
		t.Fatalf("the plugin still publishes on a node whose device plugin advertises %s: %v", vocabulary.ResourceGPU, err)
	}
	ev := waitNodeEvent(t, ctx, coexistence.ReasonConflict, since)
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, vocabulary.ResourceGPU+"=8") || !strings.Contains(ev.Message, "docs/migration.md") {
		t.Errorf("conflict event %s %q: want a Warning naming %s=8 and docs/migration.md", ev.Type, ev.Message, vocabulary.ResourceGPU)
	}

	dp.Stop()
	// The kubelet keeps the capacity of a stopped device plugin for five
	// minutes, with nothing allocatable: that is when the plugin publishes.
	waitAllocatable(t, ctx, 0)
	if err := poll(ctx, func(ctx context.Context) (bool, error) { return len(nodeSlices(t, ctx, env.node)) == before, nil }); err != nil {
		t.Fatalf("the plugin does not publish its %d ResourceSlices again after the device plugin left: %v", before, err)
	}
	if ev := waitNodeEvent(t, ctx, coexistence.ReasonResolved, since); ev.Type != corev1.EventTypeNormal {
		t.Errorf("resolved event is %s, want Normal", ev.Type)
	}
}

// waitAllocatable waits until the Node's allocatable nvidia.com/gpu is n
// (absent counts as 0).
func waitAllocatable(t *testing.T, ctx context.Context, n int64) {
	t.Helper()
	var got resource.Quantity
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		node, err := env.cluster.Client.CoreV1().Nodes().Get(ctx, env.node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = node.Status.Allocatable[corev1.ResourceName(vocabulary.ResourceGPU)]
		return got.Value() == n, nil
	}); err != nil {
		t.Fatalf("node %s allocatable %s = %s, want %d: %v", env.node, vocabulary.ResourceGPU, got.String(), n, err)
	}
}

// waitNodeEvent waits for an event with the reason on the node, newer than since.
func waitNodeEvent(t *testing.T, ctx context.Context, reason string, since time.Time) corev1.Event {
	t.Helper()
	var found *corev1.Event
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		evs, err := env.cluster.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + env.node + ",reason=" + reason,
		})
		if err != nil {
			return false, nil
		}
		for i := range evs.Items {
			if evs.Items[i].LastTimestamp.After(since) {
				found = &evs.Items[i]
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no %s event on node %s: %v", reason, env.node, err)
	}
	return *found
}

// With controller.migProfileDeviceClasses the controller makes a class per
// MIG profile the node publishes (the chart lists none), and a device plugin
// pod spec for one of them runs on a MIG device of that profile.
func TestMigrationMIGProfileClasses(t *testing.T) {
	ctx := testContext(t)
	const profile = "1g.20gb" // H100 80GB; not in the chart's list
	client := env.cluster.Client
	t.Cleanup(func() { // after the release is restored (last in, first out)
		err := client.ResourceV1().DeviceClasses().DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: modelclasses.ModelClassLabel(driverName) + "=true"})
		if err != nil {
			t.Errorf("delete the per-profile classes: %v", err)
		}
	})
	saveRelease(t, ctx)
	upgradeRelease(t, ctx, "--set", "controller.migProfileDeviceClasses=true")
	class := deviceclass.ProfileClass{Profile: profile}.Name(driverName)
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		dc, err := client.ResourceV1().DeviceClasses().Get(ctx, class, metav1.GetOptions{})
		return err == nil && dc.Spec.ExtendedResourceName != nil && *dc.Spec.ExtendedResourceName == vocabulary.MIGResourceName(profile), nil
	}); err != nil {
		t.Fatalf("no DeviceClass %s serving %s: %v", class, vocabulary.MIGResourceName(profile), err)
	}
	ns := newNamespace(t, ctx, "e2e-migration-profiles")
	d := runDevicePluginPod(t, ctx, ns, "mig", vocabulary.MIGResourceName(profile))
	if d.Attributes[vocabulary.AttrType] != string(vocabulary.KindMIG) || d.Attributes[vocabulary.AttrProfile] != profile {
		t.Errorf("%s got %s (type %s, profile %s), want a %s MIG device", vocabulary.MIGResourceName(profile), d.Device,
			d.Attributes[vocabulary.AttrType], d.Attributes[vocabulary.AttrProfile], profile)
	}
}
