package crash

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/childproc"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/prepare"
)

// TestRecoveryCrash kills the plugin at each step of its own recovery (a
// corrupt or deleted checkpoint, a preparation to roll back, an orphaned
// spec) and checks that the next start converges as if nothing had
// happened: the prepared claim stays prepared with its MIG instance, the
// interrupted one is rolled back, and unprepare later finds everything.
func TestRecoveryCrash(t *testing.T) {
	corrupt := func(t *testing.T, dirs pluginrun.Dirs) {
		writeFile(t, checkpointPath(dirs), `{"version":"v1","checksum":"sha256:00","data":{"claims":{}}}`)
	}
	deleted := func(t *testing.T, dirs pluginrun.Dirs) {
		if err := os.Remove(checkpointPath(dirs)); err != nil {
			t.Fatal(err)
		}
	}
	tests := map[string]struct {
		damage func(*testing.T, pluginrun.Dirs)
		// interrupt leaves the second claim half-prepared.
		interrupt bool
		// orphan adds an unreadable spec named like the driver's.
		orphan  bool
		crashAt string
	}{
		"corrupt checkpoint, crash after the copy":          {damage: corrupt, crashAt: prepare.FaultRecoverCorruptCopied},
		"corrupt checkpoint, crash after the rebuilt save":  {damage: corrupt, crashAt: prepare.FaultRecoverRebuiltSaved},
		"corrupt checkpoint, crash after an orphan removal": {damage: corrupt, orphan: true, crashAt: prepare.FaultRecoverOrphanRemoved},
		"deleted checkpoint":                                {damage: deleted},
		"deleted checkpoint, crash after the rebuilt save":  {damage: deleted, crashAt: prepare.FaultRecoverRebuiltSaved},
		"interrupted prepare, crash after its rollback":     {interrupt: true, crashAt: prepare.FaultRecoverRolledBack},
		"orphaned spec, crash after its removal":            {orphan: true, crashAt: prepare.FaultRecoverOrphanRemoved},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dirs, kept, other := recoverySetup(t)
			ctx := context.Background()
			c := startChild(t, dirs, "")
			if _, err := c.Kubelet.PrepareOne(ctx, kept); err != nil {
				t.Fatalf("prepare: %v\n%s", err, pluginLog(dirs))
			}
			stopChild(t, c)
			if tc.interrupt {
				c := startChild(t, dirs, prepare.FaultPrepareMIGCreated)
				go func() { _, _ = c.Kubelet.PrepareOne(ctx, other) }()
				waitDead(t, dirs, c, prepare.FaultPrepareMIGCreated)
			}
			if tc.orphan {
				writeFile(t, orphanSpecPath(t, dirs, kept.UID), "not a CDI spec")
			}
			if tc.damage != nil {
				tc.damage(t, dirs)
			}
			if tc.crashAt != "" {
				waitDead(t, dirs, startCrashingChild(t, dirs, tc.crashAt), tc.crashAt)
			}

			c = startChild(t, dirs, "")
			defer stopChild(t, c)
			for _, claim := range []*resourceapi.ResourceClaim{kept, other} {
				checkConsistent(t, dirs, claim.UID)
			}
			if !completed(t, dirs, kept.UID) || !hasSpec(t, dirs, kept.UID) {
				t.Fatalf("the prepared claim was forgotten: completed=%v spec=%v\n%s", completed(t, dirs, kept.UID), hasSpec(t, dirs, kept.UID), pluginLog(dirs))
			}
			if completed(t, dirs, other.UID) || len(simInstances(t, dirs, 1)) != 0 {
				t.Fatalf("the interrupted claim was not rolled back: instances on GPU 1 = %+v", simInstances(t, dirs, 1))
			}
			if n := len(simInstances(t, dirs, 0)); n != 1 {
				t.Fatalf("MIG instances of the prepared claim on GPU 0 = %d, want 1", n)
			}
			// A corrupt file is kept once, however often recovery was
			// interrupted.
			copies, _ := filepath.Glob(checkpointPath(dirs) + ".corrupt-*")
			if want := strings.HasPrefix(name, "corrupt checkpoint"); (len(copies) == 1) != want || len(copies) > 1 {
				t.Errorf("quarantined copies %v, want one exactly for a corrupt checkpoint", copies)
			}
			if matches, _ := filepath.Glob(orphanSpecPath(t, dirs, kept.UID)); tc.orphan && len(matches) != 0 {
				t.Errorf("orphaned spec left: %v", matches)
			}
			// Both claims work on: unprepare finds the rebuilt MIG
			// instance, the rolled-back claim prepares afresh.
			if err := c.Kubelet.UnprepareOne(ctx, kept); err != nil {
				t.Fatalf("unprepare after recovery: %v", err)
			}
			if insts := simInstances(t, dirs, 0); len(insts) != 0 {
				t.Errorf("unprepare left MIG instances on GPU 0: %+v", insts)
			}
			if _, err := c.Kubelet.PrepareOne(ctx, other); err != nil {
				t.Fatalf("prepare of the rolled-back claim: %v\n%s", err, pluginLog(dirs))
			}
		})
	}
}

// TestCorruptCheckpointLeaksNoMIG loses the checkpoint while a MIG instance
// the driver created is known only to it (prepare before the spec is
// written, unprepare after the spec is removed): the next start must still
// destroy the instance, or the GPU would publish it as a static MIG device
// for ever. An operator's static instance is never touched.
func TestCorruptCheckpointLeaksNoMIG(t *testing.T) {
	tests := map[string]struct {
		prepareFirst bool   // prepare the claim before the crash
		crashAt      string // where prepare or unprepare dies
		recoverAt    string // where the first recovery dies, if anywhere
		// kept: the spec survives, so the claim is rebuilt as prepared
		// and its instance is in use, not leaked.
		kept bool
	}{
		"prepare, instance created":                         {crashAt: prepare.FaultPrepareMIGCreated},
		"prepare, spec written":                             {crashAt: prepare.FaultPrepareCDIWritten, kept: true},
		"unprepare, spec removed":                           {prepareFirst: true, crashAt: prepare.FaultUnprepareCDIGone},
		"prepare, instance created; recovery dies after it": {crashAt: prepare.FaultPrepareMIGCreated, recoverAt: prepare.FaultRecoverLeakedMIGDestroyed},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dirs, _, claim := recoverySetup(t)
			ctx := context.Background()
			// An operator's MIG instance, made before the plugin ran:
			// static, not the driver's, so never destroyed.
			static := createStaticMIG(t, dirs, 2)
			if tc.prepareFirst {
				c := startChild(t, dirs, "")
				if _, err := c.Kubelet.PrepareOne(ctx, claim); err != nil {
					t.Fatalf("prepare: %v\n%s", err, pluginLog(dirs))
				}
				stopChild(t, c)
			}
			c := startChild(t, dirs, tc.crashAt)
			go func() {
				if tc.prepareFirst {
					_ = c.Kubelet.UnprepareOne(ctx, claim)
				} else {
					_, _ = c.Kubelet.PrepareOne(ctx, claim)
				}
			}()
			waitDead(t, dirs, c, tc.crashAt)
			if n := len(simInstances(t, dirs, 1)); n != 1 {
				t.Fatalf("MIG instances on GPU 1 after the crash = %d, want the claim's", n)
			}
			writeFile(t, checkpointPath(dirs), "{garbage")
			if tc.recoverAt != "" {
				waitDead(t, dirs, startCrashingChild(t, dirs, tc.recoverAt), tc.recoverAt)
			}

			c = startChild(t, dirs, "")
			defer stopChild(t, c)
			want := 0
			if tc.kept {
				want = 1
			}
			if insts := simInstances(t, dirs, 1); len(insts) != want {
				t.Fatalf("MIG instances on GPU 1 after recovery = %+v, want %d", insts, want)
			}
			if completed(t, dirs, claim.UID) != tc.kept {
				t.Fatalf("claim completed after recovery = %v, want %v", !tc.kept, tc.kept)
			}
			if insts := simInstances(t, dirs, 2); len(insts) != 1 || insts[0].ID != static {
				t.Fatalf("MIG instances on GPU 2 after recovery = %+v, want the static one (GI %d) untouched", insts, static)
			}
			if intents, _ := filepath.Glob(filepath.Join(dirs.PluginData, "mig-intents", "*")); len(intents) != want {
				t.Errorf("MIG intents left: %v, want %d", intents, want)
			}
			// The dynamic device is published again and prepares.
			if _, err := c.Kubelet.PrepareOne(ctx, claim); err != nil {
				t.Fatalf("prepare after recovery: %v\n%s", err, pluginLog(dirs))
			}
			if err := c.Kubelet.UnprepareOne(ctx, claim); err != nil {
				t.Fatalf("unprepare after recovery: %v", err)
			}
			if insts := simInstances(t, dirs, 1); len(insts) != 0 {
				t.Errorf("MIG instances on GPU 1 at the end = %+v, want none", insts)
			}
		})
	}
}

// createStaticMIG partitions GPU gpu as an admin would before the plugin
// starts, and returns the GPU instance ID.
func createStaticMIG(t *testing.T, dirs pluginrun.Dirs, gpu int) uint32 {
	t.Helper()
	m, err := dirs.SimState(machine, nodeName)
	if err != nil {
		t.Fatal(err)
	}
	if ret := m.Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	defer m.Shutdown()
	dev, ret := m.DeviceGetHandleByIndex(gpu)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	inst, err := mig.Create(context.Background(), dev, 9, mig.Placement{Start: 0, Size: 4})
	if err != nil {
		t.Fatal(err)
	}
	return inst.GIID
}

// recoverySetup allocates two MIG claims, on GPUs 0 and 1, and writes them
// where the child finds them.
func recoverySetup(t *testing.T) (pluginrun.Dirs, *resourceapi.ResourceClaim, *resourceapi.ResourceClaim) {
	t.Helper()
	dirs, err := pluginrun.NewDirs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	node := simnode.New(t, machine, nodeName)
	cluster := at.NewCluster(node.Slices(driverName), deviceclass.DeviceClasses(driverName))
	migOn := func(name string, gpu string) *resourceapi.ResourceClaim {
		return at.Claim(name, at.Exactly("mig", "mig."+driverName, 1,
			`device.attributes["gpu.dra.dev"].parentMinor == `+gpu, `device.attributes["gpu.dra.dev"].profile == "2g.20gb"`))
	}
	claims := cluster.MustAllocate(t, nodeName, migOn("kept", "0"), migOn("other", "1"))
	data, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dirs.Root, claimsFile), string(data))
	return dirs, claims[0], claims[1]
}

// startCrashingChild starts a plugin that is expected to die at crashAt
// before it registers (during recovery).
func startCrashingChild(t *testing.T, dirs pluginrun.Dirs, crashAt string) *childproc.Child {
	t.Helper()
	c, err := childproc.Spawn(dirs, crashAt)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitDead waits for the child to be killed at crashAt.
func waitDead(t *testing.T, dirs pluginrun.Dirs, c *childproc.Child, crashAt string) {
	t.Helper()
	if err := c.WaitKilled(30 * time.Second); err != nil {
		t.Fatalf("want the plugin killed at %s: %v\n%s", crashAt, err, pluginLog(dirs))
	}
}

func checkpointPath(dirs pluginrun.Dirs) string {
	return filepath.Join(dirs.PluginData, nodeplugin.CheckpointFile)
}

// orphanSpecPath is a spec file name of the driver's for a claim nobody
// prepared, made from the name of uid's spec.
func orphanSpecPath(t *testing.T, dirs pluginrun.Dirs, uid types.UID) string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dirs.CDI, "*"+string(uid)+".json"))
	if err != nil || len(matches) != 1 {
		t.Fatalf("spec of claim %s: %v %v", uid, matches, err)
	}
	return strings.Replace(matches[0], string(uid), "0rphan00-0000-4000-8000-000000000000", 1)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A claim to roll back on a GPU that is lost at restart must not stop the
// node: the plugin starts, serves the healthy GPUs, keeps the claim's entry
// and finishes the rollback once the GPU is back.
func TestRestartWithLostGPU(t *testing.T) {
	dirs, kept, stuck := recoverySetup(t)
	ctx := context.Background()
	c := startChild(t, dirs, prepare.FaultPrepareMIGCreated)
	go func() { _, _ = c.Kubelet.PrepareOne(ctx, stuck) }()
	waitDead(t, dirs, c, prepare.FaultPrepareMIGCreated)
	setGPULost(t, dirs, 1, true)

	c = startChild(t, dirs, "")
	if _, err := c.Kubelet.PrepareOne(ctx, kept); err != nil {
		t.Fatalf("prepare on a healthy GPU while GPU 1 is lost: %v\n%s", err, pluginLog(dirs))
	}
	if err := c.Kubelet.UnprepareOne(ctx, stuck); err == nil {
		t.Errorf("unprepare of the claim on the lost GPU succeeded")
	}
	stopChild(t, c)

	setGPULost(t, dirs, 1, false)
	c = startChild(t, dirs, "")
	defer stopChild(t, c)
	checkConsistent(t, dirs, stuck.UID)
	if insts := simInstances(t, dirs, 1); len(insts) != 0 {
		t.Errorf("the stuck claim's MIG instance survived the rollback: %+v", insts)
	}
	if _, err := c.Kubelet.PrepareOne(ctx, stuck); err != nil {
		t.Fatalf("prepare once GPU 1 is back: %v", err)
	}
}

func setGPULost(t *testing.T, dirs pluginrun.Dirs, gpu int, lost bool) {
	t.Helper()
	m, err := dirs.SimState(machine, nodeName)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetGPULost(gpu, lost); err != nil {
		t.Fatal(err)
	}
}
