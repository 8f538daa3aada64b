package computedomain

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podClaim creates a pod on node and its own channel claim of the domain
// (reserved for it), as the resource claim controller makes it from the
// domain's template.
func (e *env) podClaim(t *testing.T, domainName, pod, node string) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: ns, UID: k8sUID(pod)}, Spec: corev1.PodSpec{NodeName: node}}
	if _, err := e.client.CoreV1().Pods(ns).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: pod + "-channel", Namespace: ns},
		Spec:       ChannelClaimSpec(domain(domainName), driver, 0),
		Status: resourceapi.ResourceClaimStatus{ReservedFor: []resourceapi.ResourceClaimConsumerReference{
			{Resource: "pods", Name: pod, UID: p.UID},
		}},
	}
	if _, err := e.client.ResourceV1().ResourceClaims(ns).Create(e.ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) endPod(t *testing.T, pod string) {
	t.Helper()
	if err := e.client.ResourceV1().ResourceClaims(ns).Delete(e.ctx, pod+"-channel", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.client.CoreV1().Pods(ns).Delete(e.ctx, pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A template-mode domain's pods are those its pods' own claims are
// reserved for (a claim of another domain does not count): PodsScheduled,
// pruning and AfterLastPod follow them as they follow a shared claim.
func TestTemplateModePods(t *testing.T) {
	e := newEnv(t, nil, domain("train", templateMode, afterLastPod(60)), domain("other", templateMode))
	e.sync(t, "train")
	if c := condition(t, e.get(t, "train"), ConditionPodsScheduled); c.Reason != ReasonNeverHadPods {
		t.Fatalf("PodsScheduled %+v before any pod, want NeverHadPods", c)
	}
	e.podClaim(t, "train", "worker-0", "tray-1")
	e.podClaim(t, "train", "worker-1", "tray-2")
	e.podClaim(t, "other", "eval-0", "tray-3")
	e.report(t, "train", node("tray-1", "Connected"), node("tray-2", "Connected"), node("tray-3", "Connected"))
	e.sync(t, "train")
	if c := condition(t, e.get(t, "train"), ConditionPodsScheduled); c.Status != metav1.ConditionTrue || !contains(c.Message, "2 pods") {
		t.Errorf("PodsScheduled %+v, want True with 2 pods", c)
	}
	e.now = e.now.Add(2 * time.Minute) // the prune grace period is 1m
	e.sync(t, "train")
	if got := nodeNames(e.get(t, "train")); len(got) != 2 || got[0] != "tray-1" || got[1] != "tray-2" {
		t.Errorf("entries %v, want tray-1 and tray-2 (tray-3 runs another domain's pod)", got)
	}

	e.endPod(t, "worker-0")
	e.endPod(t, "worker-1")
	if after := e.sync(t, "train"); after != 60*time.Second {
		t.Errorf("look again after %v, want the grace period", after)
	}
	if c := condition(t, e.get(t, "train"), ConditionPodsScheduled); c.Reason != ReasonNoPods {
		t.Errorf("PodsScheduled %+v, want NoPods", c)
	}
	// A new pod the cache has not seen keeps the domain.
	e.freezeClaims(t)
	e.podClaim(t, "train", "worker-2", "tray-1")
	e.now = e.now.Add(61 * time.Second)
	e.sync(t, "train")
	if !e.domainExists(t, "train") {
		t.Fatal("deleted while the API server has a claim of the domain in use")
	}
	e.endPod(t, "worker-2")
	e.now = e.now.Add(61 * time.Second)
	e.sync(t, "train")
	e.now = e.now.Add(61 * time.Second)
	e.sync(t, "train")
	if e.domainExists(t, "train") {
		t.Error("AfterLastPod template-mode domain not deleted after its last pod")
	}
	if !e.domainExists(t, "other") {
		t.Error("the other domain was deleted")
	}
}

func TestChannelDomain(t *testing.T) {
	cd := domain("train")
	for name, tc := range map[string]struct {
		claim *resourceapi.ResourceClaim
		want  string
	}{
		"the domain's": {&resourceapi.ResourceClaim{Spec: ChannelClaimSpec(cd, driver, 3)}, "train"},
		"other driver": {&resourceapi.ResourceClaim{Spec: ChannelClaimSpec(cd, "gpu.nvidia.com", 3)}, ""},
		"no config":    {&resourceapi.ResourceClaim{}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			if got := channelDomain(tc.claim, driver); got != tc.want {
				t.Errorf("channelDomain = %q, want %q", got, tc.want)
			}
		})
	}
}
