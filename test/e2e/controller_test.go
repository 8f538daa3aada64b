package e2e

import (
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
)

// TestControllerAdmission: kubectl apply of a ResourceClaim with an invalid GpuConfig
// is refused by the dra-controller's webhook with a message naming the field; a
// valid one is admitted.
func TestControllerAdmission(t *testing.T) {
	ctx := testContext(t)
	r := env.runner
	t.Cleanup(func() {
		if err := r.CleanupController(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	results, err := r.Admission(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != len(scenarios.AdmissionCases) {
		t.Fatalf("%d results for %d cases", len(results), len(scenarios.AdmissionCases))
	}
	for _, a := range results {
		t.Logf("%s (%s): admitted=%v: kubectl: %s; API: %s", a.Case.Name, a.Case.Title, a.Admitted, a.Output, a.APIError)
		if p := a.Problem(); p != "" {
			t.Error(p)
		}
		if a.Case.Valid && a.APIError != "" {
			t.Errorf("%s: the dry run of a valid claim failed: %s", a.Case.Name, a.APIError)
		}
	}
}

// TestControllerNodeLabels: the node carries the GFD labels derived from its
// ResourceSlices, with the values GFD writes for the simulated machine.
func TestControllerNodeLabels(t *testing.T) {
	ctx := testContext(t)
	got, want, err := env.runner.WaitGFDLabels(ctx, env.node)
	if err != nil {
		t.Fatalf("%v: %v", err, scenarios.LabelDiff(got, want))
	}
	if env.simulate == "dgxh100" {
		fixed := map[string]string{
			"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
			"nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.family": "hopper",
			"nvidia.com/mig.capable": "true", "gpu.dra.dev/driver": "true",
		}
		for _, d := range scenarios.LabelDiff(got, fixed) {
			t.Error(d)
		}
	}
	t.Logf("labels of %s: %v", env.node, scenarios.FormatLabels(got))
}
