package kubectlgpu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/telemetry"
)

type owners map[uint32]telemetry.ProcessOwner

func (o owners) Owner(pid uint32) (telemetry.ProcessOwner, bool) { p, ok := o[pid]; return p, ok }
func (o owners) Keep(map[uint32]bool)                            {}

// handlerReader reads a pod's metrics from the handler of its node.
type handlerReader map[string]http.Handler

func (r handlerReader) ReadMetrics(ctx context.Context, pod *corev1.Pod, port int) ([]byte, error) {
	h, ok := r[pod.Spec.NodeName]
	if !ok || port != 9401 {
		return nil, fmt.Errorf("connection refused on port %d", port)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, telemetry.MetricsPath, nil))
	return io.ReadAll(rec.Result().Body)
}

func pluginPod(name, node string, args ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "gpu-dra-driver", Name: name, Labels: map[string]string{"app.kubernetes.io/component": "kubelet-plugin"}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "plugin", Args: args}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// Two time-sliced pods with different loads, read from the real collector
// over the simulated GPUs: top tells them apart, per namespace or all.
func TestTop(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-a")
	uuid := node.GPUs[0].UUID
	for pid, reg := range map[uint32]nvmlsim.Registration{
		101: {Devices: []string{uuid}, SMPercent: 20, MemoryBytes: 2 << 30},
		102: {Devices: []string{uuid}, SMPercent: 55, MemoryBytes: 10 << 30},
		103: {Devices: []string{uuid}, SMPercent: 5},
	} {
		stop, err := node.Machine.RegisterProcess(pid, reg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
	holders := telemetry.HolderFunc(func() map[string][]telemetry.Holder {
		return map[string][]telemetry.Holder{uuid: {
			{Device: "gpu-0-ts", Namespace: "team-a", Claim: "light-gpu", Pod: "light", PodUID: "u-light", Container: "main"},
			{Device: "gpu-0-ts", Namespace: "team-b", Claim: "heavy-gpu", Pod: "heavy", PodUID: "u-heavy", Container: "main"},
		}}
	})
	c := telemetry.NewCollector(telemetry.CollectorOptions{NVML: node.Machine, NodeName: "node-a", GPUs: node.GPUs, Holders: holders,
		Processes: owners{101: {PodUID: "u-light"}, 102: {PodUID: "u-heavy"}}})
	reader := handlerReader{"node-a": telemetry.Handler(telemetry.NewRegistry(nil, c))}
	// The light pod's share has 20Gi of the GPU's memory; the heavy pod's
	// claim says nothing of memory.
	lightClaim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "light-gpu"}}
	lightClaim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "share", Driver: "gpu.dra.dev", Pool: "node-a", Device: "gpu-0-ts",
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("20Gi")},
	}}}}
	client := fake.NewClientset(
		pluginPod("plugin-a", "node-a", "--metrics-address=:9400", "--local-metrics-address=127.0.0.1:9401"),
		pluginPod("plugin-b", "node-b", "--metrics-address=:9400"),
		lightClaim,
	)

	var out, errOut bytes.Buffer
	err := RunTop(context.Background(), client, Options{Out: &out, ErrOut: &errOut}, TopOptions{Namespace: "team-a", Reader: reader})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "NODE") {
		t.Fatalf("top -n team-a:\n%s", out.String())
	}
	for _, want := range []string{"node-a", "team-a", "light", "main", "gpu-0-ts", "timeslice", "20%", "2Gi/20Gi"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("row %q lacks %q", lines[1], want)
		}
	}
	if !strings.Contains(errOut.String(), "plugin-b on node-b: not running or serves no local metrics") {
		t.Errorf("no warning about the plugin without local metrics: %q", errOut.String())
	}

	out.Reset()
	if err := RunTop(context.Background(), client, Options{Out: &out, Output: OutputJSON}, TopOptions{Node: "node-a", Reader: reader}); err != nil {
		t.Fatal(err)
	}
	var list TopList
	if err := json.Unmarshal(out.Bytes(), &list); err != nil {
		t.Fatalf("top -A -o json: %v\n%s", err, out.String())
	}
	sm := map[string]float64{}
	for _, r := range list.Items {
		if r.SMPercent == nil {
			t.Fatalf("row without SM: %+v", r)
		}
		sm[r.Namespace+"/"+r.Pod] = math.Round(*r.SMPercent*100) / 100
		limit := int64(node.GPUs[0].MemoryBytes)
		if r.Pod == "light" {
			limit = 20 << 30
		}
		if r.MemoryLimitBytes != limit || r.UUID != uuid || r.GPU != "gpu-0" || r.Processes != 1 {
			t.Errorf("row %+v: want limit %d (the share's memory, else the GPU's), one process", r, limit)
		}
	}
	if want := map[string]float64{"team-a/light": 20, "team-b/heavy": 55, "/": 5}; fmt.Sprint(sm) != fmt.Sprint(want) {
		t.Errorf("SM by pod %v, want %v (with the process in no pod)", sm, want)
	}
}

func TestTopErrors(t *testing.T) {
	reader := handlerReader{}
	tests := map[string]struct {
		pods    []*corev1.Pod
		opts    TopOptions
		want    string
		warning string
	}{
		"no plugin":      {opts: TopOptions{Node: "node-x"}, want: "no kubelet plugin pods (label app.kubernetes.io/component=kubelet-plugin) on node node-x"},
		"unreachable":    {pods: []*corev1.Pod{pluginPod("p", "node-z", "--local-metrics-address=127.0.0.1:9401")}, warning: "plugin pod gpu-dra-driver/p on node-z: connection refused"},
		"a bad port arg": {pods: []*corev1.Pod{pluginPod("p", "node-z", "--local-metrics-address=127.0.0.1:x")}, warning: "serves no local metrics"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			client := fake.NewClientset()
			for _, p := range tc.pods {
				if _, err := client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			tc.opts.Reader = reader
			var errOut bytes.Buffer
			err := RunTop(context.Background(), client, Options{Out: io.Discard, ErrOut: &errOut}, tc.opts)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("RunTop = %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil || !strings.Contains(errOut.String(), tc.warning) {
				t.Errorf("RunTop = %v, warnings %q; want warning %q", err, errOut.String(), tc.warning)
			}
		})
	}
}

// Claims the user may not list leave the devices' memory as the limits.
func TestTopClaimsForbidden(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-a")
	uuid := node.GPUs[0].UUID
	stop, err := node.Machine.RegisterProcess(7, nvmlsim.Registration{Devices: []string{uuid}, SMPercent: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	holders := telemetry.HolderFunc(func() map[string][]telemetry.Holder {
		return map[string][]telemetry.Holder{uuid: {{Device: "gpu-0-ts", Namespace: "ns", Claim: "c", Pod: "p", PodUID: "u", Container: "main"}}}
	})
	c := telemetry.NewCollector(telemetry.CollectorOptions{NVML: node.Machine, NodeName: "node-a", GPUs: node.GPUs, Holders: holders, Processes: owners{7: {PodUID: "u"}}})
	client := fake.NewClientset(pluginPod("plugin-a", "node-a", "--local-metrics-address=127.0.0.1:9401"))
	client.PrependReactor("list", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "", errors.New("RBAC"))
	})
	list, warnings, err := Top(context.Background(), client, TopOptions{Namespace: "ns", Reader: handlerReader{"node-a": telemetry.Handler(telemetry.NewRegistry(nil, c))}})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].MemoryLimitBytes != int64(node.GPUs[0].MemoryBytes) {
		t.Errorf("rows %+v, want one with the GPU's memory as limit", list.Items)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "cannot list resourceclaims") {
		t.Errorf("warnings %q", warnings)
	}
}
