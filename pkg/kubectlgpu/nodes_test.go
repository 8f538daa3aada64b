package kubectlgpu_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/internal/golden"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
)

// The golden file is also the sample in docs/kubectl-gpu.md.
func TestNodesGolden(t *testing.T) {
	c := standardCluster(t).client()
	for name, output := range map[string]string{"nodes.golden": "", "nodes-wide.golden": "wide"} {
		t.Run(name, func(t *testing.T) {
			golden.Check(t, "testdata/"+name, []byte(mustRun(t, c, nodes(), output)))
		})
	}
}

func TestNodesTable(t *testing.T) {
	out := mustRun(t, standardCluster(t).client(), nodes(), "")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("want a header, 2 nodes and a total, got:\n%s", out)
	}
	nodeA, nodeB, total := lines[1], lines[2], lines[3]
	for _, want := range []string{
		"node-a", "8× NVIDIA H100 80GB HBM3", "637.2Gi",
		"gpu-0 timeslice 2/4 (compute 50%, memory 39.8Gi)",
		"gpu-1 whole", "gpu-2 whole",
		"gpu-3 mig 1g.10gb×2,3g.40gb",
		"gpu-4 mps 1/4 (compute 50%, memory 20Gi)",
		"gpu-7 gpu.dra.dev/unhealthy=XID79-reboot-required:NoExecute",
	} {
		if !strings.Contains(nodeA, want) {
			t.Errorf("node-a row lacks %q:\n%s", want, nodeA)
		}
	}
	if strings.Contains(nodeA, "gpu-5") || strings.Contains(nodeA, "gpu-6") {
		t.Errorf("free GPUs are counted, not listed:\n%s", nodeA)
	}
	if fields := strings.Fields(nodeB); fields[0] != "node-b" || !strings.Contains(nodeB, "4× NVIDIA L4") || !strings.Contains(nodeB, " no ") {
		t.Errorf("node-b row: %s", nodeB)
	}
	for _, want := range []string{"TOTAL (2 nodes)", "8× NVIDIA H100 80GB HBM3, 4× NVIDIA L4", "8/12", "1 tainted",
		"6 of 12 GPUs: 3 whole, 1 mig (3 devices), 1 timeslice, 1 mps (3 shares)"} {
		if !strings.Contains(total, want) {
			t.Errorf("total row lacks %q:\n%s", want, total)
		}
	}
	// Columns line up: every row has IN USE where the header has it.
	col := len([]rune(lines[0])) - len("IN USE")
	for _, l := range lines[1:] {
		if r := []rune(l); len(r) <= col || r[col-1] != ' ' || r[col] == ' ' {
			t.Errorf("IN USE column not aligned at %d in %q", col, l)
		}
	}
}

func TestNodesWideNamesClaims(t *testing.T) {
	out := mustRun(t, standardCluster(t).client(), nodes(), "wide")
	for _, want := range []string{"DRIVER", "550.54.15", "DEVICES", "224",
		"gpu-0 timeslice 2/4 (compute 50%, memory 39.8Gi) [default/ts-a default/ts-b]", "gpu-0 whole [team-b/infer]"} {
		if !strings.Contains(out, want) {
			t.Errorf("wide output lacks %q:\n%s", want, out)
		}
	}
}

func TestNodesJSONAndYAML(t *testing.T) {
	c := standardCluster(t).client()
	var list kubectlgpu.NodeList
	if err := json.Unmarshal([]byte(mustRun(t, c, nodes(), "json")), &list); err != nil {
		t.Fatal(err)
	}
	var fromYAML kubectlgpu.NodeList
	if err := yaml.UnmarshalStrict([]byte(mustRun(t, c, nodes(), "yaml")), &fromYAML); err != nil {
		t.Fatal(err)
	}
	if list.Kind != kubectlgpu.KindNodeList || fromYAML.Kind != list.Kind || len(fromYAML.Nodes) != len(list.Nodes) {
		t.Errorf("json kind %q, yaml kind %q with %d nodes", list.Kind, fromYAML.Kind, len(fromYAML.Nodes))
	}
	if len(list.Nodes) != 2 || list.Nodes[0].Name != "node-a" {
		t.Fatalf("nodes: %+v", list.Nodes)
	}
	a := list.Nodes[0]
	if a.GPUCount != 8 || a.Free != 3 || a.MIGCapable != 8 || a.Tainted != 1 || a.Devices != 224 || a.Claims != 7 {
		t.Errorf("node-a summary %+v", a)
	}
	gpu0 := a.GPUs[0].Usage
	if gpu0.State != kubectlgpu.StateTimeSlicing || len(gpu0.Shares) != 1 {
		t.Fatalf("gpu-0 usage %+v", gpu0)
	}
	if s := gpu0.Shares[0]; s.Used != 2 || s.Allowed != 4 || s.ComputePercent != 50 || s.Device != "gpu-0-ts" {
		t.Errorf("gpu-0 shares %+v", s)
	}
	if u := a.GPUs[3].Usage; u.State != kubectlgpu.StateMIG || len(u.MIG) != 2 || u.MIG[0] != (kubectlgpu.ProfileCount{Profile: "1g.10gb", Count: 2}) {
		t.Errorf("gpu-3 usage %+v", u)
	}
	if m := a.GPUs[4].Usage.Shares[0].Memory; m.String() != "20Gi" {
		t.Errorf("gpu-4 MPS memory %s, want 20Gi", m.String())
	}
	if tt := a.GPUs[7].Taints; len(tt) != 1 || tt[0].String() != "gpu.dra.dev/unhealthy=XID79-reboot-required:NoExecute" {
		t.Errorf("gpu-7 taints %v", tt)
	}
	want := kubectlgpu.Total{Nodes: 2, GPUs: 12, MIGCapable: 8, Free: 6, Tainted: 1, Whole: 3, MIG: 1, TimeSlicing: 1, MPS: 1, MIGDevices: 3, Shares: 3}
	got := list.Total
	if got.Memory.String() != "744608Mi" || len(got.Models) != 2 {
		t.Errorf("total memory %s, models %v", got.Memory.String(), got.Models)
	}
	got.Memory, got.Models = want.Memory, nil
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("total (-want +got):\n%s", diff)
	}
}

// docs/kubectl-gpu.md shows the golden outputs; after -update, copy them
// there.
func TestDocsShowTheGoldenOutputs(t *testing.T) {
	doc, err := os.ReadFile("../../docs/kubectl-gpu.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nodes.golden", "node-a.golden", "claims-all.golden",
		"nodes-passthrough.golden", "claims-passthrough.golden"} {
		sample, err := os.ReadFile("testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), "```\n"+string(sample)+"```\n") {
			t.Errorf("docs/kubectl-gpu.md does not show testdata/%s as it is", name)
		}
	}
}
