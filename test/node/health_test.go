package node

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
)

func freeAddress(t *testing.T) string {
	t.Helper()
	addr, err := pluginrun.FreeAddress()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// taintOn returns the taint of a published device, or nil.
func taintOn(t *testing.T, client kubernetes.Interface, device string) *resourceapi.DeviceTaint {
	t.Helper()
	list, err := client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			if d.Name == device && len(d.Taints) > 0 {
				return &d.Taints[0]
			}
		}
	}
	return nil
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v", what, within)
	return 0
}

// scrape returns the plugin's /metrics.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s %v", resp.Status, err)
	}
	return string(body)
}

// tryScrape is scrape for a plugin that may not listen yet (just restarted):
// "" until it answers.
func tryScrape(addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

func injectEvent(t *testing.T, addr, query string) {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/simulate/event?"+query, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("inject %s: %s %s", query, resp.Status, body)
	}
}

// An XID takes a GPU out of scheduling (device taint) and is reported on
// the kubelet's health stream within a second; the state survives a plugin
// restart; and since the simulated hardware reports that XID 79 needs a node
// reboot, the GPU stays tainted past the recovery window and through a GPU
// reset, and comes back once the node has rebooted (a new boot ID).
func TestHealthTaintsAndReports(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dirs, _, claims, _ := setup(t, map[string]int64{"held": 1})
	// The pod using the claim, as the scheduler records it.
	claims["held"].Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "trainer-0", UID: "pod-uid"}}
	client := apiserver.NodeClient(nodeName, claims["held"])
	// The pod: its trainer container uses the claim, its logger does not.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: claims["held"].Namespace, Name: "trainer-0", UID: "pod-uid"},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claims["held"].Name}},
			Containers: []corev1.Container{
				{Name: "trainer", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}},
				{Name: "logger"},
			},
		},
	}
	if _, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := dirs.Config(machine, nodeName)
	cfg.KubeClient = client
	cfg.MetricsAddress = freeAddress(t)
	cfg.HealthRecoveryWindow = 3 * time.Second
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	if _, err := p.Kubelet.PrepareOne(ctx, claims["held"]); err != nil {
		t.Fatal(err)
	}
	held := claims["held"].Status.Allocation.Devices.Results[0].Device
	stream, err := p.Kubelet.WatchHealth(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "slices published", func() bool {
		l, _ := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		return len(l.Items) > 0
	})

	injectEvent(t, cfg.MetricsAddress, "gpu=0&xid=79")
	took := eventually(t, time.Second, "taint on "+held, func() bool { return taintOn(t, client, held) != nil })
	taint := taintOn(t, client, held)
	if taint.Effect != resourceapi.DeviceTaintEffectNoExecute || taint.Value != "XID79-reboot-required" {
		t.Errorf("taint = %+v, want XID79-reboot-required NoExecute (the GPU fell off the bus, NVML asks for a reboot)", taint)
	}
	t.Logf("taint published %v after the XID", took)
	deadline := time.After(time.Second)
	for unhealthy := false; !unhealthy; {
		select {
		case msg := <-stream:
			for _, d := range msg.Devices {
				unhealthy = unhealthy || (d.Device.DeviceName == held && d.Health == drahealthv1.HealthStatus_UNHEALTHY)
			}
		case <-deadline:
			t.Fatalf("no UNHEALTHY report for %s on the health stream within 1s", held)
		}
	}
	if taintOn(t, client, "gpu-1") != nil {
		t.Errorf("a healthy GPU got tainted")
	}

	// Metrics carry the holder of the device, down to the container using
	// it once the plugin has looked up the pod.
	var body string
	eventually(t, 10*time.Second, "container label in /metrics", func() bool {
		body = scrape(t, cfg.MetricsAddress)
		return strings.Contains(body, `container="trainer"`)
	})
	for _, want := range []string{fmt.Sprintf(`claim="%s"`, claims["held"].Name), `pod="trainer-0"`, `namespace="default"`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks the holder label %s", want)
		}
	}
	if strings.Contains(body, `container="logger"`) {
		t.Error("/metrics names a container that does not use the claim")
	}

	// A restart on the same boot keeps the GPU unhealthy.
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	p, err = inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "taint after restart", func() bool { return taintOn(t, client, held) != nil })
	// The kubelet does not prepare the running pod's claim again: the
	// restarted plugin finds its pod and container by itself.
	eventually(t, 10*time.Second, "container label in /metrics after restart", func() bool {
		return strings.Contains(tryScrape(cfg.MetricsAddress), `container="trainer"`)
	})
	// Past the window and a poll (5s), and after a GPU reset and another
	// poll, the GPU is still tainted: only a reboot ends what NVML asks for.
	time.Sleep(cfg.HealthRecoveryWindow + 6*time.Second)
	if taintOn(t, client, held) == nil {
		t.Fatal("taint lifted by the recovery window, though NVML asks for a node reboot")
	}
	injectEvent(t, cfg.MetricsAddress, "gpu=0&reset=true")
	time.Sleep(6 * time.Second)
	if tt := taintOn(t, client, held); tt == nil || tt.Value != "XID79-reboot-required" {
		t.Fatalf("taint after a GPU reset: %+v, want XID79-reboot-required still", tt)
	}
	injectEvent(t, cfg.MetricsAddress, "reboot=true")
	eventually(t, 10*time.Second, "recovery after the reboot", func() bool { return taintOn(t, client, held) == nil })
}
