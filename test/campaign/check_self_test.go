package campaign

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
			if err := r.child.Stop(); err != nil {
				t.Error(err)
			}
			r.child = nil
		})
	}
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
