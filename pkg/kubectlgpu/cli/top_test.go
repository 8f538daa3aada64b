package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu/cli"
)

// pluginMetrics is what a plugin serves: two containers on a time-sliced GPU.
const pluginMetrics = `# TYPE gpu_dra_container_sm_utilization_ratio gauge
gpu_dra_container_sm_utilization_ratio{claim="a",container="main",device="gpu-0-ts",gpu="gpu-0",namespace="team-a",node="node-a",pod="light",uuid="GPU-0"} 0.2
gpu_dra_container_sm_utilization_ratio{claim="b",container="main",device="gpu-0-ts",gpu="gpu-0",namespace="team-b",node="node-a",pod="heavy",uuid="GPU-0"} 0.6
# TYPE gpu_dra_container_memory_used_bytes gauge
gpu_dra_container_memory_used_bytes{claim="a",container="main",device="gpu-0-ts",gpu="gpu-0",namespace="team-a",node="node-a",pod="light",uuid="GPU-0"} 2.147483648e+09
# TYPE gpu_dra_device_memory_total_bytes gauge
gpu_dra_device_memory_total_bytes{claim="a",container="main",device="gpu-0-ts",gpu="gpu-0",namespace="team-a",node="node-a",pod="light",uuid="GPU-0"} 8.589934592e+10
`

type cannedMetrics struct{ ports []int }

func (c *cannedMetrics) ReadMetrics(_ context.Context, _ *corev1.Pod, port int) ([]byte, error) {
	c.ports = append(c.ports, port)
	return []byte(pluginMetrics), nil
}

func TestTopCommand(t *testing.T) {
	plugin := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "gpu-dra-driver", Name: "plugin-a", Labels: map[string]string{"app.kubernetes.io/component": "kubelet-plugin"}},
		Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Args: []string{"--local-metrics-address=127.0.0.1:9555"}}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	run := func(args ...string) (string, *cannedMetrics) {
		t.Helper()
		reader := &cannedMetrics{}
		var out, errOut bytes.Buffer
		cmd := cli.NewCommand(cli.Options{
			Streams: genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
			Client:  fake.NewClientset(plugin),
			Metrics: reader,
		})
		cmd.SetArgs(append([]string{"top"}, args...))
		if err := cmd.Execute(); err != nil {
			t.Fatalf("kubectl gpu top %v: %v (%s)", args, err, errOut.String())
		}
		return out.String(), reader
	}
	out, reader := run("-n", "team-b")
	if !strings.Contains(out, "heavy") || strings.Contains(out, "light") || !strings.Contains(out, "60%") {
		t.Errorf("top -n team-b:\n%s", out)
	}
	if len(reader.ports) != 1 || reader.ports[0] != 9555 {
		t.Errorf("read ports %v, want the plugin's local metrics port 9555", reader.ports)
	}
	out, _ = run("-A", "--node", "node-a", "-o", "json")
	var list kubectlgpu.TopList
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Items) != 2 {
		t.Fatalf("top -A -o json: %v\n%s", err, out)
	}
	if r := list.Items[0]; r.Pod != "light" || r.MemoryUsedBytes != 2<<30 || r.MemoryLimitBytes != 80<<30 || *r.SMPercent != 20 {
		t.Errorf("light row %+v", r)
	}
	out, _ = run("-A", "--node", "node-b")
	if out != "" {
		t.Errorf("top on a node without a plugin printed %q", out)
	}
}
