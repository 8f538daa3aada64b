package computedomain

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

func afterLastPod(grace int32) func(*gpuv1beta1.ComputeDomain) {
	return func(cd *gpuv1beta1.ComputeDomain) {
		cd.Spec.Lifetime = &gpuv1beta1.ComputeDomainLifetime{Policy: gpuv1beta1.LifetimeAfterLastPod, GracePeriodSeconds: ptr.To(grace)}
	}
}

// lastPodGone starts an AfterLastPod domain "job" (grace 60s) whose one pod
// came and went; the controller saw both.
func lastPodGone(t *testing.T) *env {
	t.Helper()
	e := newEnv(t, nil, domain("job", afterLastPod(60)))
	e.sync(t, "job")
	e.reserve(t, "job-channel", "tray-1")
	e.sync(t, "job")
	e.reserve(t, "job-channel")
	if after := e.sync(t, "job"); after != 60*time.Second {
		t.Fatalf("look again after %v, want the grace period", after)
	}
	return e
}

func (e *env) domainExists(t *testing.T, name string) bool {
	t.Helper()
	_, err := e.dyn.Resource(gpuv1beta1.ComputeDomainResource).Namespace(ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil && !isNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// forgeCondition writes the PodsScheduled condition as a tenant with
// patch on computedomains/status can: any status, reason and time, even
// under the controller's field manager.
func (e *env) forgeCondition(t *testing.T, name string, status metav1.ConditionStatus, reason string, at time.Time) {
	t.Helper()
	cond := metav1.Condition{Type: ConditionPodsScheduled, Status: status, Reason: reason, Message: "forged", LastTransitionTime: metav1.NewTime(at)}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&cond)
	if err != nil {
		t.Fatal(err)
	}
	patch := applyObject(domain(name))
	patch.Object["status"] = map[string]any{"conditions": []any{m}}
	if _, err := e.dyn.Resource(gpuv1beta1.ComputeDomainResource).Namespace(ns).ApplyStatus(e.ctx, name, patch,
		metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
		t.Fatal(err)
	}
}

func TestAfterLastPodSurvivesRestart(t *testing.T) {
	e := newEnv(t, nil, domain("job", afterLastPod(60)))
	e.sync(t, "job")
	// Before any pod: never deleted.
	e.now = e.now.Add(time.Hour)
	e.sync(t, "job")
	if c := condition(t, e.get(t, "job"), ConditionPodsScheduled); c.Reason != ReasonNeverHadPods {
		t.Fatalf("PodsScheduled %+v, want NeverHadPods", c)
	}
	e.reserve(t, "job-channel", "tray-1")
	e.sync(t, "job")
	e.reserve(t, "job-channel")
	if after := e.sync(t, "job"); after != 60*time.Second {
		t.Errorf("look again after %v, want the grace period", after)
	}
	// The controller restarts 50s later. The stored NoPods condition says
	// the domain had pods, so it is still deleted; its time alone is not
	// trusted (a tenant can write it), so the grace counts from the
	// restarted controller's first look: longer, never shorter.
	restarted := startEnv(t, e.client, e.dyn, e.now.Add(50*time.Second))
	if after := restarted.sync(t, "job"); after != 60*time.Second {
		t.Errorf("after the restart: look again after %v, want a whole grace period", after)
	}
	restarted.now = restarted.now.Add(59 * time.Second)
	restarted.sync(t, "job")
	if !restarted.domainExists(t, "job") {
		t.Fatal("domain deleted before a grace period passed since the restart")
	}
	restarted.now = restarted.now.Add(time.Second)
	restarted.sync(t, "job")
	if restarted.domainExists(t, "job") {
		t.Error("domain not deleted after its grace period")
	}
}

// TestAfterLastPodRestartAfterDeadline: a controller that was down past the
// deadline deletes the domain a grace period after it is back.
func TestAfterLastPodRestartAfterDeadline(t *testing.T) {
	e := lastPodGone(t)
	restarted := startEnv(t, e.client, e.dyn, e.now.Add(time.Hour))
	if after := restarted.sync(t, "job"); after != 60*time.Second || !restarted.domainExists(t, "job") {
		t.Fatalf("look again after %v, want the grace period and the domain kept", after)
	}
	restarted.now = restarted.now.Add(60 * time.Second)
	restarted.sync(t, "job")
	if restarted.domainExists(t, "job") {
		t.Error("domain not deleted a grace period after the restart")
	}
}

// TestAfterLastPodStaleClaimCache: the claim cache lags and shows no pod
// while the API server's claim has one again: the live read keeps the
// domain.
func TestAfterLastPodStaleClaimCache(t *testing.T) {
	e := lastPodGone(t)
	e.freezeClaims(t)
	e.reserve(t, "job-channel", "tray-2") // a new pod, not in the cache
	e.now = e.now.Add(time.Hour)
	if after := e.sync(t, "job"); after <= 0 {
		t.Errorf("look again after %v, want a recheck", after)
	}
	if !e.domainExists(t, "job") {
		t.Fatal("domain deleted while the API server's claim has a pod")
	}
	// The pod goes (the cache still lags): deleted a grace period after the
	// controller saw the claim in use, not at once.
	e.reserve(t, "job-channel")
	e.sync(t, "job")
	if !e.domainExists(t, "job") {
		t.Fatal("domain deleted without a grace period after the pod seen live went")
	}
	e.now = e.now.Add(60 * time.Second)
	e.sync(t, "job")
	if e.domainExists(t, "job") {
		t.Error("domain not deleted after the grace period")
	}
}

// TestAfterLastPodForgedCondition: a tenant writes PodsScheduled=False
// NoPods with an old transition time, under the controller's field
// manager, to cut the grace period short.
func TestAfterLastPodForgedCondition(t *testing.T) {
	longAgo := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	t.Run("just after the last pod went", func(t *testing.T) {
		e := lastPodGone(t)
		e.forgeCondition(t, "job", metav1.ConditionFalse, ReasonNoPods, longAgo)
		e.now = e.now.Add(30 * time.Second)
		if after := e.sync(t, "job"); after != 30*time.Second || !e.domainExists(t, "job") {
			t.Fatalf("look again after %v, want the rest of the grace period (30s) and the domain kept", after)
		}
		e.now = e.now.Add(30 * time.Second)
		e.sync(t, "job")
		if e.domainExists(t, "job") {
			t.Error("domain not deleted after the grace period")
		}
	})
	t.Run("while the pods run, cache lagging", func(t *testing.T) {
		e := newEnv(t, nil, domain("job", afterLastPod(60)))
		e.sync(t, "job")
		e.freezeClaims(t) // the cache never sees the pod
		e.reserve(t, "job-channel", "tray-1")
		e.forgeCondition(t, "job", metav1.ConditionFalse, ReasonNoPods, longAgo)
		for range 3 {
			e.now = e.now.Add(time.Hour)
			e.sync(t, "job")
		}
		if !e.domainExists(t, "job") {
			t.Fatal("domain deleted while its pod runs")
		}
	})
	t.Run("before any pod", func(t *testing.T) {
		// Forging NoPods on a domain that never had pods starts the grace
		// period now, not at the forged time.
		e := newEnv(t, nil, domain("job", afterLastPod(60)))
		e.sync(t, "job")
		e.forgeCondition(t, "job", metav1.ConditionFalse, ReasonNoPods, longAgo)
		if after := e.sync(t, "job"); after != 60*time.Second || !e.domainExists(t, "job") {
			t.Fatalf("look again after %v, want the grace period and the domain kept", after)
		}
	})
}

// TestAfterLastPodDeleteRace: the domain changes between the controller's
// live read and its delete (a node writes its entry): the resource version
// precondition fails the delete, and the controller looks again.
func TestAfterLastPodDeleteRace(t *testing.T) {
	e := lastPodGone(t)
	raced := false
	e.dyn.PrependReactor("delete", "computedomains", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if raced {
			return false, nil, nil
		}
		raced = true
		// Through the tracker: the fake client is locked during a reaction.
		tracker := e.dyn.Tracker()
		obj, err := tracker.Get(action.GetResource(), ns, "job")
		if err != nil {
			return true, nil, err
		}
		u := obj.(*unstructured.Unstructured).DeepCopy()
		if err := unstructured.SetNestedSlice(u.Object, []any{map[string]any{"name": "tray-1"}}, "status", "nodes"); err != nil {
			return true, nil, err
		}
		bumpResourceVersion(u)
		return false, nil, tracker.Update(action.GetResource(), u, ns)
	})
	e.now = e.now.Add(60 * time.Second)
	if after := e.sync(t, "job"); after <= 0 || !raced {
		t.Fatalf("look again after %v (delete tried: %v), want a recheck", after, raced)
	}
	if !e.domainExists(t, "job") {
		t.Fatal("domain deleted although it changed after the check")
	}
	e.sync(t, "job")
	if e.domainExists(t, "job") {
		t.Error("domain not deleted at the next look")
	}
}

func TestWithOwnerIsNotDeleted(t *testing.T) {
	e := newEnv(t, nil, domain("kept"))
	e.sync(t, "kept")
	e.reserve(t, "kept-channel", "tray-1")
	e.sync(t, "kept")
	e.reserve(t, "kept-channel")
	e.sync(t, "kept")
	e.now = e.now.Add(time.Hour)
	e.sync(t, "kept")
	e.get(t, "kept")
}
