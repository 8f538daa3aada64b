package scenarios

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// Every shipped scenario loads, creates its own namespace and has a title.
func TestLoadDemoSpecs(t *testing.T) {
	all, err := Load("../../demo/specs")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) < 8 {
		t.Errorf("want at least the 8 scenarios, have %d", len(all))
	}
	for _, s := range all {
		if s.Title == "" || strings.Contains(s.Title, "\n") {
			t.Errorf("%s: title %q", s.Name, s.Title)
		}
		for _, o := range s.Objects {
			if o.GetKind() != "Namespace" && o.GetNamespace() == "" && o.GetKind() != "DeviceClass" {
				t.Errorf("%s: %s %s has no namespace: it would land in the runner's default", s.Name, o.GetKind(), o.GetName())
			}
			if ns := o.GetNamespace(); ns != "" && !contains(s.Namespaces(), ns) {
				t.Errorf("%s: %s %s is in namespace %s, which the scenario does not create (and cleanup would not delete)", s.Name, o.GetKind(), o.GetName(), ns)
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func TestLeadingComment(t *testing.T) {
	for name, tc := range map[string]struct{ in, title, rest string }{
		"scenario prefix": {"# Scenario 4: MIG 1g.10gb and 3g.40gb pods on one GPU.\n# More text.\n# And more.\nkind: x", "MIG 1g.10gb and 3g.40gb pods on one GPU", "More text.\nAnd more."},
		"one line":        {"# Just a title\nkind: x", "Just a title", ""},
		"wrapped title":   {"# A title that goes\n# on. Rest.\n", "A title that goes on", "Rest."},
		"no comment":      {"kind: x", "", ""},
	} {
		t.Run(name, func(t *testing.T) {
			title, rest := leadingComment([]byte(tc.in))
			if title != tc.title || rest != tc.rest {
				t.Errorf("got (%q, %q), want (%q, %q)", title, rest, tc.title, tc.rest)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	r := &Runner{Driver: "gpu.dra.dev"}
	good := func() *PodReport {
		return &PodReport{
			Namespace: "ns", Name: "p", Node: "n", Phase: corev1.PodRunning,
			Claims: []ClaimReport{{Name: "c", Devices: []DeviceReport{{
				Driver: "gpu.dra.dev", Device: "gpu-1",
				Attributes: map[string]string{"type": "gpu", "minor": "1", "uuid": "GPU-1"},
			}}}},
			ContainerOrder: []string{"ctr"},
			Containers: map[string]*ContainerView{"ctr": {
				Env:       map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-1"},
				DevNodes:  []string{"/dev/nvidia1", "/dev/nvidiactl"},
				NvidiaSMI: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)",
			}},
		}
	}
	if p := r.Check(good()); len(p) != 0 {
		t.Errorf("good report: %v", p)
	}
	for name, tc := range map[string]struct {
		mutate func(*PodReport)
		want   string
	}{
		"wrong GPU visible": {func(p *PodReport) { p.Containers["ctr"].Env["NVIDIA_VISIBLE_DEVICES"] = "GPU-2" }, "lacks GPU-1"},
		"no device node":    {func(p *PodReport) { p.Containers["ctr"].DevNodes = []string{"/dev/nvidiactl"} }, "no /dev/nvidia1"},
		"not in nvidia-smi": {func(p *PodReport) { p.Containers["ctr"].NvidiaSMI = "" }, "nvidia-smi -L does not list GPU-1"},
		"unallocated claim": {func(p *PodReport) { p.Claims[0].Devices = nil }, "not allocated"},
		"not running":       {func(p *PodReport) { p.Phase = corev1.PodPending }, "not Running"},
		"mps without pipe": {func(p *PodReport) {
			p.Claims[0].Devices[0].Attributes["type"] = "mps"
			p.Containers["ctr"].Env["CUDA_MPS_PIPE_DIRECTORY"] = "/tmp/nvidia-mps"
		}, "no control socket"},
	} {
		t.Run(name, func(t *testing.T) {
			rep := good()
			tc.mutate(rep)
			problems := strings.Join(r.Check(rep), "\n")
			if !strings.Contains(problems, tc.want) {
				t.Errorf("problems %q do not mention %q", problems, tc.want)
			}
		})
	}
}

// TestTaintAction: the recovery action is read from a health taint value
// ("<reason>-<action>-required"); plain reasons and other keys name none.
func TestTaintAction(t *testing.T) {
	for lines, want := range map[string]string{
		"gpu-0: " + HealthTaintKey + "=XID79-reboot-required:NoExecute":           "reboot",
		"gpu-0: " + HealthTaintKey + "=XID63-drain-and-reset-required:NoSchedule": "drain-and-reset",
		"gpu-0: " + HealthTaintKey + "=XID48-reset-required:NoSchedule":           "reset",
		"gpu-0: " + HealthTaintKey + "=XID48:NoSchedule":                          "",
		"gpu-0: other.example/x=a-b-required:NoSchedule":                          "",
	} {
		if got := taintAction([]string{lines}); got != want {
			t.Errorf("taintAction(%q) = %q, want %q", lines, got, want)
		}
	}
}
