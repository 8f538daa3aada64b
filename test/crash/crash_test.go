// Package crash kills the real plugin process with SIGKILL in the middle of
// prepare and unprepare — at every step between side effects and at random
// moments — restarts it, and checks that the node converges: no orphaned
// CDI specs, no half-prepared checkpoint entries, and the kubelet's retry
// succeeds.
//
// The random moments come from a seed, taken from the clock unless -seed
// gives one; each test logs it (go test -v, and on failure) and
// `make crash SEED=N` replays its schedule of kills.
package crash

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/childproc"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/passthrough"
	"github.com/gpu-dra/gpu-dra-driver/pkg/prepare"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const (
	driverName = vocabulary.DriverName
	nodeName   = "node-1"
	machine    = "dgxh100"

	claimsFile = "claims.json"
	// policyFile, when the test writes it, is the child's device policy.
	policyFile = "device-policy.yaml"
)

// TestMain doubles as the plugin process (internal/pluginrun/childproc).
func TestMain(m *testing.M) {
	childproc.RunIfChild(runChild)
	os.Exit(simnode.Main(m))
}

func runChild(root string) error {
	data, err := os.ReadFile(filepath.Join(root, claimsFile))
	if err != nil {
		return err
	}
	var claims []*resourceapi.ResourceClaim
	if err := json.Unmarshal(data, &claims); err != nil {
		return err
	}
	dirs, err := pluginrun.NewDirs(root)
	if err != nil {
		return err
	}
	cfg := dirs.Config(machine, nodeName)
	if _, err := os.Stat(filepath.Join(root, policyFile)); err == nil {
		cfg.DevicePolicyFile = filepath.Join(root, policyFile)
	}
	cfg.KubeClient = apiserver.NodeClient(nodeName, claims...)
	cfg.FaultHook = childproc.Journaling(root, childproc.KillAt(root, childproc.CrashAt()))
	childproc.ConfigurePod(cfg)
	return childproc.Serve(cfg)
}

func startChild(t testing.TB, dirs pluginrun.Dirs, crashAt string) *childproc.Child {
	t.Helper()
	return startChildOf(t, os.Args[0], dirs, crashAt)
}

// startChildOf starts bin, a build of this package (possibly of another
// release), as the plugin and registers with it.
func startChildOf(t testing.TB, bin string, dirs pluginrun.Dirs, crashAt string) *childproc.Child {
	t.Helper()
	c, err := childproc.StartBinary(bin, dirs, crashAt, 30*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, pluginLog(dirs))
	}
	return c
}

func stopChild(t testing.TB, c *childproc.Child) {
	t.Helper()
	if err := c.Stop(); err != nil {
		t.Error(err)
	}
}

func pluginLog(dirs pluginrun.Dirs) string { return childproc.Log(dirs) }

// step is one crash experiment: an operation and where it dies.
type step struct {
	prepare bool
	crashAt string        // a driver fault point, or "" for a random-time kill
	delay   time.Duration // random kill delay after the call starts
}

func TestCrashConvergence(t *testing.T) {
	// Every step between side effects, then random moments. Prepare and
	// unprepare alternate: each step leaves the claim as its operation
	// does once the retry succeeded.
	steps := []step{
		{prepare: true, crashAt: prepare.FaultPrepareStarted},
		{prepare: false, crashAt: prepare.FaultUnprepareCDIGone},
		{prepare: true, crashAt: prepare.FaultPrepareCDIWritten},
		{prepare: false, crashAt: prepare.FaultUnprepareDone},
		{prepare: true, crashAt: prepare.FaultPrepareCompleted},
		{prepare: false, crashAt: prepare.FaultUnprepareStarted},
	}
	t.Run("whole GPUs", func(t *testing.T) {
		crashSteps(t, at.Claim("victim", at.Exactly("gpus", driverName, 2)), withRandomSteps(steps, 12, killSeed(t)), nil)
	})
	t.Run("passthrough", func(t *testing.T) {
		// A passthrough claim adds the binding to vfio-pci in the middle of prepare.
		vfioSteps := append([]step{{prepare: true, crashAt: prepare.FaultPrepareVFIOBound}, {prepare: false, crashAt: prepare.FaultUnprepareCDIGone}}, steps...)
		claim := at.Claim("victim", at.Exactly("vm", "vfio."+driverName, 1, `device.attributes["gpu.dra.dev"].minor == 0`))
		bdf := simnode.New(t, machine, nodeName).GPUs[0].PCIBusID
		crashSteps(t, claim, withRandomSteps(vfioSteps, 8, killSeed(t)), func(t *testing.T, dirs pluginrun.Dirs, prepared bool) {
			// GPU 0 is on vfio-pci exactly while the claim is prepared,
			// and back on nvidia without an override once it is not.
			sys := passthrough.Sysfs{Root: filepath.Join(dirs.PluginData, "simulated-"+machine, "sys")}
			driver, err := sys.Driver(bdf)
			if err != nil {
				t.Fatal(err)
			}
			override, _ := os.ReadFile(filepath.Join(sys.Root, "bus/pci/devices", bdf, "driver_override"))
			want, wantIntents := passthrough.DriverNVIDIA, 0
			if prepared {
				want, wantIntents = passthrough.DriverVFIO, 1
			}
			o := strings.TrimSpace(string(override))
			cleared := o == "" || o == "(null)"
			if driver != want || (prepared && o != passthrough.DriverVFIO) || (!prepared && !cleared) {
				t.Fatalf("prepared=%v: GPU 0 bound to %q with driver_override %q", prepared, driver, o)
			}
			if intents, _ := filepath.Glob(filepath.Join(dirs.PluginData, "vfio-intents", "*.json")); len(intents) != wantIntents {
				t.Fatalf("prepared=%v: passthrough intents = %v, want %d", prepared, intents, wantIntents)
			}
		})
	})
	t.Run("dynamic MIG", func(t *testing.T) {
		// A MIG claim adds the instance creation in the middle of prepare.
		migSteps := append([]step{{prepare: true, crashAt: prepare.FaultPrepareMIGCreated}, {prepare: false, crashAt: prepare.FaultUnprepareCDIGone}}, steps...)
		claim := at.Claim("victim", at.Exactly("mig", "mig."+driverName, 1,
			`device.attributes["gpu.dra.dev"].parentMinor == 0`, `device.attributes["gpu.dra.dev"].profile == "2g.20gb"`))
		crashSteps(t, claim, withRandomSteps(migSteps, 8, killSeed(t)), func(t *testing.T, dirs pluginrun.Dirs, prepared bool) {
			// Nothing leaked, nothing lost: exactly the claim's instance
			// exists while it is prepared, none once it is not.
			insts := simInstances(t, dirs, 0)
			want := 0
			if prepared {
				want = 1
			}
			if len(insts) != want || (want == 1 && (insts[0].Profile != "2g.20gb" || len(insts[0].ComputeInstances) != 1)) {
				t.Fatalf("prepared=%v: MIG instances on GPU 0 = %+v", prepared, insts)
			}
			// Each instance the driver holds has its intent, no more.
			if intents, _ := filepath.Glob(filepath.Join(dirs.PluginData, "mig-intents", "*.json")); len(intents) != want {
				t.Fatalf("prepared=%v: MIG intents = %v, want %d", prepared, intents, want)
			}
		})
	})
}

func simInstances(t *testing.T, dirs pluginrun.Dirs, gpu int) []nvmlsim.GpuInstanceState {
	t.Helper()
	m, err := nvmlsim.New(machine, nvmlsim.WithSeed(nodeName),
		nvmlsim.WithStateFile(filepath.Join(dirs.PluginData, "simulated-"+machine, "nvml-state.json")))
	if err != nil {
		t.Fatal(err)
	}
	return m.GpuInstances(gpu)
}

// crashSteps runs the steps on one claim, checking the checkpoint and CDI
// invariants, and checkHW (if set) against the simulated hardware.
func crashSteps(t *testing.T, unallocated *resourceapi.ResourceClaim, steps []step, checkHW func(*testing.T, pluginrun.Dirs, bool)) {
	dirs, err := pluginrun.NewDirs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	node := simnode.New(t, machine, nodeName)
	// Everything published, passthrough devices too, by the child as here.
	policy := "default: {passthrough: true}\n"
	if err := os.WriteFile(filepath.Join(dirs.Root, policyFile), []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	on := true
	node.Resources = devicemodel.Build(node.GPUs, devicemodel.Options{NodeName: nodeName,
		Policy: devicemodel.Policy{Default: devicemodel.GPUPolicy{Passthrough: &on}}})
	cluster := at.NewCluster(node.Slices(driverName), deviceclass.DeviceClasses(driverName))
	claim := cluster.MustAllocate(t, nodeName, unallocated)[0]
	data, err := json.Marshal([]*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirs.Root, claimsFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if checkHW == nil {
		checkHW = func(*testing.T, pluginrun.Dirs, bool) {}
	}

	ctx := context.Background()
	for i, s := range steps {
		t.Logf("step %d: prepare=%v crashAt=%q delay=%v", i, s.prepare, s.crashAt, s.delay)
		c := startChild(t, dirs, s.crashAt)
		errc := make(chan error, 1)
		go func() {
			if s.prepare {
				_, err := c.Kubelet.PrepareOne(ctx, claim)
				errc <- err
			} else {
				errc <- c.Kubelet.UnprepareOne(ctx, claim)
			}
		}()
		if s.crashAt == "" {
			time.Sleep(s.delay)
			c.Kill()
		} else {
			select {
			case <-c.Done():
				_ = c.Kubelet.Close()
			case <-time.After(30 * time.Second):
				t.Fatalf("plugin did not crash at %s\n%s", s.crashAt, pluginLog(dirs))
			}
		}
		<-errc // the call fails or finished before the kill; either is fine

		c = startChild(t, dirs, "")
		checkConsistent(t, dirs, claim.UID)
		// The kubelet retries the operation until it succeeds.
		if s.prepare {
			if _, err := c.Kubelet.PrepareOne(ctx, claim); err != nil {
				t.Fatalf("step %d: prepare after restart: %v\n%s", i, err, pluginLog(dirs))
			}
			if !hasSpec(t, dirs, claim.UID) || !completed(t, dirs, claim.UID) {
				t.Fatalf("step %d: prepared claim lacks spec or checkpoint entry", i)
			}
			checkHW(t, dirs, true)
		} else {
			if err := c.Kubelet.UnprepareOne(ctx, claim); err != nil {
				t.Fatalf("step %d: unprepare after restart: %v", i, err)
			}
			if hasSpec(t, dirs, claim.UID) || completed(t, dirs, claim.UID) {
				t.Fatalf("step %d: unprepared claim left a spec or checkpoint entry", i)
			}
			checkHW(t, dirs, false)
		}
		checkConsistent(t, dirs, claim.UID)
		stopChild(t, c)
	}
}

// checkConsistent asserts the invariant a restart must establish: no
// half-prepared claims, and a spec exists exactly for completed claims.
func checkConsistent(t *testing.T, dirs pluginrun.Dirs, uid types.UID) {
	t.Helper()
	cp, err := checkpoint.NewFileStore(filepath.Join(dirs.PluginData, nodeplugin.CheckpointFile)).Load(context.Background())
	if err != nil {
		t.Fatalf("load checkpoint: %v", err)
	}
	for _, c := range cp.All() {
		if c.State != checkpoint.PrepareCompleted {
			t.Errorf("claim %s left in state %s after restart", c.UID, c.State)
		}
	}
	if hasSpec(t, dirs, uid) != completed(t, dirs, uid) {
		t.Errorf("spec present=%v but checkpoint completed=%v\n%s", hasSpec(t, dirs, uid), completed(t, dirs, uid), pluginLog(dirs))
	}
}

func hasSpec(t *testing.T, dirs pluginrun.Dirs, uid types.UID) bool {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dirs.CDI, "*"+string(uid)+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return len(matches) > 0
}

func completed(t *testing.T, dirs pluginrun.Dirs, uid types.UID) bool {
	t.Helper()
	cp, err := checkpoint.NewFileStore(filepath.Join(dirs.PluginData, nodeplugin.CheckpointFile)).Load(context.Background())
	if err != nil {
		t.Fatalf("load checkpoint: %v", err)
	}
	c, ok := cp.Get(uid)
	return ok && c.State == checkpoint.PrepareCompleted
}
