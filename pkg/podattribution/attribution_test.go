package podattribution

import (
	"context"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

// reservedClaim is claim "train-gpu" in namespace "ml", reserved for the pods.
func reservedClaim(uid types.UID, pods ...podRef) *resourceapi.ResourceClaim {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train-gpu", UID: uid}}
	for _, p := range pods {
		claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
	}
	// Not a pod: ignored.
	claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{APIGroup: "batch", Resource: "jobs", Name: "j", UID: "job-uid"})
	return claim
}

// trainerPod uses claim train-gpu by name in container trainer, and request
// "small" of it in the sidecar.
func trainerPod(name string, uid types.UID) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, UID: uid},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("train-gpu")}},
			InitContainers: []corev1.Container{{
				Name: "exporter", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu", Request: "small"}}},
			}},
			Containers: []corev1.Container{ctr("trainer", corev1.ResourceClaim{Name: "gpu"}), ctr("logger")},
		},
	}
}

// lookedUp waits until the attribution has looked up the pod.
func lookedUp(t *testing.T, a *Attribution, uid types.UID) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		_, ok := a.known[uid]
		a.mu.Unlock()
		if ok {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("pod %s not looked up within 10s", uid)
}

func TestAttribution(t *testing.T) {
	p1 := podRef{Namespace: "ml", Name: "trainer-0", UID: "pod-1"}
	errUnavailable := apierrors.NewServiceUnavailable("etcd is down")
	tests := map[string]struct {
		pods []*corev1.Pod
		// failures is how many GETs fail with errUnavailable first.
		failures int
		want     []Consumer
		wantGets int64
	}{
		"pod found": {
			pods: []*corev1.Pod{trainerPod("trainer-0", "pod-1")},
			want: []Consumer{{Pod: "trainer-0", PodUID: "pod-1", Container: "exporter", Requests: []string{"small"}}, {Pod: "trainer-0", PodUID: "pod-1", Container: "trainer"}},
			// Two claims and a second prepare of one: still one GET.
			wantGets: 1,
		},
		"transient errors retried": {
			pods:     []*corev1.Pod{trainerPod("trainer-0", "pod-1")},
			failures: 2,
			want:     []Consumer{{Pod: "trainer-0", PodUID: "pod-1", Container: "exporter", Requests: []string{"small"}}, {Pod: "trainer-0", PodUID: "pod-1", Container: "trainer"}},
			wantGets: 3,
		},
		"pod not found": {
			want:     []Consumer{{Pod: "trainer-0", PodUID: "pod-1"}},
			wantGets: 1,
		},
		"pod recreated under the same name": {
			pods:     []*corev1.Pod{trainerPod("trainer-0", "pod-2")},
			want:     []Consumer{{Pod: "trainer-0", PodUID: "pod-1"}},
			wantGets: 1,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			var objs []runtime.Object
			for _, p := range tc.pods {
				objs = append(objs, p)
			}
			client := fake.NewClientset(objs...)
			var gets atomic.Int64
			client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				if gets.Add(1) <= int64(tc.failures) {
					return true, nil, errUnavailable
				}
				return false, nil, nil
			})
			a := newAttribution(client.CoreV1(), workqueue.NewTypedItemExponentialFailureRateLimiter[podRef](time.Millisecond, 10*time.Millisecond))
			go a.Run(ctx)

			a.Record(ctx, reservedClaim("claim-1", p1))
			a.Record(ctx, reservedClaim("claim-2", p1))
			lookedUp(t, a, p1.UID)
			a.Record(ctx, reservedClaim("claim-1", p1))
			for _, uid := range []types.UID{"claim-1", "claim-2"} {
				if got := a.Consumers(uid); !reflect.DeepEqual(got, tc.want) {
					t.Errorf("consumers of %s = %+v, want %+v", uid, got, tc.want)
				}
			}
			if got := gets.Load(); got != tc.wantGets {
				t.Errorf("%d GETs of the pod, want %d", got, tc.wantGets)
			}

			// Forgotten with the last claim reserved for it.
			a.Forget("claim-1")
			if got := a.Consumers("claim-2"); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("after unprepare of another claim: consumers = %+v, want %+v", got, tc.want)
			}
			a.Forget("claim-2")
			if got := a.Consumers("claim-2"); got != nil {
				t.Errorf("consumers of an unprepared claim: %+v", got)
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			if len(a.known) != 0 {
				t.Errorf("pods still known after their claims were unprepared: %v", a.known)
			}
		})
	}
}

// Until the lookup succeeds, the pod is a holder without container. A pod
// whose claim is unprepared before its lookup is not looked up, and one
// unprepared during its lookup is not kept.
func TestAttributionUnpreparedEarly(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(trainerPod("trainer-0", "pod-1"))
	a := New(client.CoreV1())
	client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		a.Forget("claim-1") // unprepared while the GET is in flight
		return false, nil, nil
	})

	a.Record(ctx, reservedClaim("claim-1", podRef{Name: "trainer-0", UID: "pod-1"}))
	a.Record(ctx, reservedClaim("claim-2", podRef{Name: "trainer-1", UID: "pod-2"}))
	if got, want := a.Consumers("claim-1"), []Consumer{{Pod: "trainer-0", PodUID: "pod-1"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("consumers before the lookup = %+v, want %+v", got, want)
	}
	a.Forget("claim-2")
	for range 2 {
		a.processNext(ctx)
	}
	if n := len(client.Actions()); n != 1 {
		t.Errorf("%d API calls, want 1 (no GET of a pod whose claim is gone)", n)
	}
	if len(a.known) != 0 {
		t.Errorf("a pod looked up after its claim was unprepared is kept: %v", a.known)
	}
}

func TestAttributionWithoutClient(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	a := New(nil)
	a.Run(ctx) // returns at once
	a.Record(ctx, reservedClaim("claim-1", podRef{Name: "trainer-0", UID: "pod-1"}))
	if got, want := a.Consumers("claim-1"), []Consumer{{Pod: "trainer-0", PodUID: "pod-1"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("consumers = %+v, want %+v", got, want)
	}
	if a.queue.Len() != 0 {
		t.Error("a lookup was queued without a client")
	}
}
