package campaign

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/passthrough"
)

// The invariant checks find what they are meant to find: each case plants
// one inconsistency between the model and the node and expects its report.
func TestChecksCatchPlantedFaults(t *testing.T) {
	for name, tc := range map[string]struct {
		kind  string
		plant func(t *testing.T, r *run, c *claim)
		want  []string
	}{
		"spec of a prepared claim deleted": {kindGPU, func(t *testing.T, r *run, c *claim) {
			removeSpec(t, r, c)
		}, []string{"claim lost: prepared claim " + "%s has no CDI spec", "does not resolve"}},
		"claim the kubelet unprepared still held": {kindMIG, func(t *testing.T, r *run, c *claim) {
			delete(r.claims, c.uid())
		}, []string{"leak: checkpoint entry", "leak: CDI spec", "leak: MIG instance"}},
		"MPS share the kubelet unprepared still held": {kindMPS, func(t *testing.T, r *run, c *claim) {
			delete(r.claims, c.uid())
		}, []string{"leak: MPS share"}},
		"time-slice share the kubelet unprepared still held": {kindTS, func(t *testing.T, r *run, c *claim) {
			delete(r.claims, c.uid())
		}, []string{"leak: time-slicing share"}},
		"passthrough claim the kubelet unprepared still held": {kindVFIO, func(t *testing.T, r *run, c *claim) {
			delete(r.claims, c.uid())
		}, []string{"leak: checkpoint entry", "leak: GPU 0000:", `bound to "vfio-pci" with driver_override "vfio-pci", held by no live claim`}},
		"GPU of a prepared passthrough claim back on nvidia": {kindVFIO, func(t *testing.T, r *run, c *claim) {
			v, err := readNode(r.dirs, r.uuids)
			if err != nil {
				t.Fatal(err)
			}
			e, _ := v.cp.Get(c.obj.UID)
			sys := passthrough.Sysfs{Root: filepath.Join(r.dirs.PluginData, "simulated-"+machine, "sys")}
			if err := sys.ToNVIDIA(t.Context(), e.Devices[0].VFIOPCIBusID); err != nil {
				t.Fatal(err)
			}
		}, []string{"of prepared passthrough claim %s is bound to \"nvidia\", not vfio-pci"}},
		"channel claim the kubelet unprepared still held": {kindChannel, func(t *testing.T, r *run, c *claim) {
			delete(r.claims, c.uid())
		}, []string{"leak: checkpoint entry", "leak: CDI spec", "leak: the IMEX daemon of ComputeDomain", "leak: the IMEX daemon record of ComputeDomain"}},
		"IMEX daemon of a prepared channel claim gone": {kindChannel, func(t *testing.T, r *run, c *claim) {
			stopPlugin(t, r) // its poller would start the daemon again
			v, err := readNode(r.dirs, r.uuids)
			if err != nil {
				t.Fatal(err)
			}
			for _, pid := range v.imex[string(domainUID(c.domain))].pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				for running(pid) {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}, []string{"claim lost: no IMEX daemon of ComputeDomain", "the checkpoint holds it: true, its daemon runs: false"}},
		"channel held by claims of two domains": {kindChannel, func(t *testing.T, r *run, c *claim) {
			stopPlugin(t, r)
			cp, err := loadCheckpoint(r.dirs)
			if err != nil {
				t.Fatal(err)
			}
			e, _ := cp.Get(c.obj.UID)
			ghost := *e
			ch := *e.Devices[0].IMEXChannel
			ch.DomainName = slices.DeleteFunc(slices.Clone(r.domains), func(d string) bool { return d == c.domain })[0]
			ghost.UID, ghost.Name, ghost.Devices = "ghost-uid", "ghost", slices.Clone(e.Devices)
			ghost.Devices[0].IMEXChannel = &ch
			cp.Put(&ghost)
			if err := checkpoint.NewFileStore(checkpointPath(r.dirs)).Save(t.Context(), cp); err != nil {
				t.Fatal(err)
			}
		}, []string{"IMEX %d is held by claims of 2 ComputeDomains"}},
		"prepared claim the plugin does not hold": {kindGPU, func(t *testing.T, r *run, c *claim) {
			ghost := &claim{obj: c.obj.DeepCopy(), kind: kindGPU, state: prepared}
			ghost.obj.UID, ghost.obj.Name = "ghost-uid", "ghost"
			r.claims[ghost.uid()] = ghost
		}, []string{"prepared claim ghost (gpu, [" + "%d" + "]) has no checkpoint entry"}},
	} {
		t.Run(name, func(t *testing.T) {
			r := newRun(t, 1, map[string]bool{})
			r.calm = true
			defer r.cleanup()
			r.start() // its canary is a prepared claim of some kind
			var c *claim
			for c == nil {
				a := r.newActionOfKind(tc.kind)
				r.execute([]*action{a}, false)
				if a.c.state == prepared {
					c = a.c
				}
			}
			if v := r.check(false); len(v) != 0 {
				t.Fatalf("violations before planting: %v", v)
			}
			tc.plant(t, r, c)
			got := strings.Join(r.check(false), "\n")
			for _, w := range tc.want {
				w = strings.ReplaceAll(w, "%s", c.obj.Name)
				w = strings.ReplaceAll(w, "%d", strings.Join(c.devices(), " "))
				if !strings.Contains(got, w) {
					t.Errorf("check did not report %q; it reported:\n%s", w, got)
				}
			}
			if r.child != nil {
				stopPlugin(t, r)
			}
		})
	}
}

// stopPlugin stops the plugin gracefully: the node stays as it is.
func stopPlugin(t *testing.T, r *run) {
	t.Helper()
	if err := r.child.Stop(); err != nil {
		t.Error(err)
	}
	r.child = nil
}

func removeSpec(t *testing.T, r *run, c *claim) {
	t.Helper()
	v, err := readNode(r.dirs, r.uuids)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(v.specs[c.uid()].Path); err != nil {
		t.Fatal(err)
	}
}
