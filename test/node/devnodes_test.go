package node

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/internal/testfs"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// On a fresh node the driver's device nodes may appear after the plugin
// started: nvidia-uvm's when the module loads, a MIG capability node when it
// is first made. A prepare before then fails naming the missing node and
// leaves nothing behind (no CDI spec, no checkpoint entry, no MIG instance),
// so the kubelet retries it; the prepare after the nodes appeared succeeds
// and the container gets them. No container starts without a node it needs.
func TestPrepareWaitsForLateDeviceNodes(t *testing.T) {
	for name, tc := range map[string]struct {
		claim *resourceapi.ResourceClaim
		// withhold names the device nodes (below dev/) that are missing
		// when the plugin starts.
		withhold func(name string) bool
		// missing is the node the failed prepare names (a prefix for MIG
		// capability nodes, whose minor depends on the instance).
		missing string
	}{
		"nvidia-uvm not loaded yet": {
			claim:    at.Claim("whole", at.Exactly("gpus", driverName, 1)),
			withhold: func(name string) bool { return strings.HasPrefix(name, "nvidia-uvm") },
			missing:  "device node /dev/nvidia-uvm",
		},
		"MIG capability node not made yet": {
			claim: migClaim("mig", "1g.10gb"),
			withhold: func(name string) bool {
				return strings.HasPrefix(name, "nvidia-caps/") && !slices.Contains([]string{"nvidia-caps/nvidia-cap1", "nvidia-caps/nvidia-cap2"}, name)
			},
			missing: "device node /dev/nvidia-caps/nvidia-cap",
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dirs, _, claims, _ := setupClaims(t, tc.claim)
			claim := claims[tc.claim.Name]
			cfg := dirs.Config(machine, nodeName)
			cfg.KubeClient = apiserver.NodeClient(nodeName, claim)
			var sim *nvmlsim.Machine
			cfg.SimulationHook = func(m *nvmlsim.Machine) {
				sim = m
				if err := m.WithholdDeviceNodes(tc.withhold); err != nil {
					t.Error(err)
				}
			}
			p, err := inprocess.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = p.Stop() }()

			_, err = p.Kubelet.PrepareOne(ctx, claim)
			if err == nil || !strings.Contains(err.Error(), tc.missing) || !strings.Contains(err.Error(), "is missing") {
				t.Fatalf("prepare before the node exists: err = %v, want one naming %s", err, tc.missing)
			}
			t.Logf("failed prepare: %v", err)
			testfs.AssertEntries(t, dirs.CDI)
			cp, err := checkpoint.NewFileStore(filepath.Join(dirs.PluginData, nodeplugin.CheckpointFile)).Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, found := cp.Get(claim.UID); found {
				t.Errorf("the failed prepare left its claim in the checkpoint")
			}
			if left := simState(t, dirs).GpuInstances(0); len(left) != 0 {
				t.Errorf("the failed prepare left MIG instances: %+v", left)
			}

			if err := sim.WithholdDeviceNodes(nil); err != nil { // the nodes appear
				t.Fatal(err)
			}
			ids, err := p.Kubelet.PrepareOne(ctx, claim)
			if err != nil {
				t.Fatalf("prepare once the nodes exist: %v", err)
			}
			spec := inject(t, dirs.CDI, ids)
			got := devicePaths(spec)
			for _, want := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", strings.TrimPrefix(tc.missing, "device node ")} {
				if !slices.ContainsFunc(got, func(p string) bool { return strings.HasPrefix(p, want) }) {
					t.Errorf("container lacks device node %s; has %v", want, got)
				}
			}
			if err := p.Kubelet.UnprepareOne(ctx, claim); err != nil {
				t.Fatal(err)
			}
		})
	}
}
