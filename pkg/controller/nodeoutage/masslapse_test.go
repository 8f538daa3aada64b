package nodeoutage

import (
	"fmt"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/internal/metricstest"
)

// cluster is n GPU nodes, gpu-node-1 to gpu-node-n, whose Leases were
// renewed a while ago.
func cluster(n int) (names []string, objs []runtime.Object) {
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("gpu-node-%d", i)
		names = append(names, name)
		objs = append(objs, nodeNamed(name), sliceNamed(name), leaseNamed(name, lastRenewal))
	}
	return names, objs
}

// phase moves the clock, renews the named nodes' Leases, syncs every node
// and says which effect each must have then.
type phase struct {
	advance time.Duration
	renew   []string
	want    map[string]resourceapi.DeviceTaintEffect // nodes not named: none
	mass    bool
}

// When the heartbeats of most nodes lapse at once, escalation stops: no
// NoExecute (existing ones go back to NoSchedule), and with MassLapseTaint
// off no new taint at all; one node lapsed among many, or fewer than the
// minimum, escalates as usual; when enough renew, escalation resumes.
func TestMassLapse(t *testing.T) {
	const noExec = 5 * time.Minute
	all := func(n int, e resourceapi.DeviceTaintEffect) map[string]resourceapi.DeviceTaintEffect {
		m := map[string]resourceapi.DeviceTaintEffect{}
		for i := 1; i <= n; i++ {
			m[fmt.Sprintf("gpu-node-%d", i)] = e
		}
		return m
	}
	others := []string{"gpu-node-2", "gpu-node-3", "gpu-node-4", "gpu-node-5"}
	for name, tc := range map[string]struct {
		nodes  int
		opts   Options
		phases []phase
	}{
		"every node lapsed: NoSchedule, no NoExecute": {
			nodes: 5, opts: Options{NoExecuteAfter: noExec, MassLapseTaint: true},
			phases: []phase{
				{},
				{advance: grace + time.Second, want: all(5, "NoSchedule"), mass: true},
				{advance: noExec, want: all(5, "NoSchedule"), mass: true},
			},
		},
		"every node lapsed, taint off: no taint at all": {
			nodes: 5, opts: Options{NoExecuteAfter: noExec},
			phases: []phase{
				{},
				{advance: grace + time.Second, mass: true},
				{advance: noExec, mass: true},
			},
		},
		"one node lapsed among many: escalates": {
			nodes: 5, opts: Options{NoExecuteAfter: noExec},
			phases: []phase{
				{},
				{advance: grace + time.Second, renew: others, want: map[string]resourceapi.DeviceTaintEffect{"gpu-node-1": "NoSchedule"}},
				{advance: noExec, renew: others, want: map[string]resourceapi.DeviceTaintEffect{"gpu-node-1": "NoExecute"}},
			},
		},
		"fewer than the minimum: escalates": {
			nodes: 2, opts: Options{NoExecuteAfter: noExec},
			phases: []phase{
				{},
				{advance: grace + time.Second, want: all(2, "NoSchedule")},
				{advance: noExec, want: all(2, "NoExecute")},
			},
		},
		"NoExecute before the mass lapse goes back to NoSchedule, and recovery": {
			nodes: 5, opts: Options{NoExecuteAfter: noExec},
			phases: []phase{
				{},
				{advance: noExec + time.Second, renew: others, want: map[string]resourceapi.DeviceTaintEffect{"gpu-node-1": "NoExecute"}},
				// Now all lapse: node 1 keeps a NoSchedule taint, no new ones.
				{advance: grace + time.Second, want: map[string]resourceapi.DeviceTaintEffect{"gpu-node-1": "NoSchedule"}, mass: true},
				{advance: noExec, want: map[string]resourceapi.DeviceTaintEffect{"gpu-node-1": "NoSchedule"}, mass: true},
				// All but node 1 renew: it escalates again.
				{renew: others, want: map[string]resourceapi.DeviceTaintEffect{"gpu-node-1": "NoExecute"}},
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			names, objs := cluster(tc.nodes)
			f := newFixture(t, tc.opts, objs...)
			for i, p := range tc.phases {
				f.clock.Step(p.advance)
				for _, n := range p.renew {
					f.renewNode(n)
				}
				for _, n := range names {
					f.syncNode(n)
				}
				for _, n := range names {
					if got := f.effectOf(n); got != p.want[n] {
						t.Errorf("phase %d: %s has effect %q, want %q", i, n, got, p.want[n])
					}
				}
				if got, want := metricstest.Value(t, f.reg, "gpu_dra_controller_outage_mass_lapse", nil), map[bool]float64{true: 1}[p.mass]; got != want {
					t.Errorf("phase %d: mass lapse gauge %v, want %v", i, got, want)
				}
			}
		})
	}
}

// A mass lapse that holds a taint back says so on each node it holds back,
// once.
func TestMassLapseEvents(t *testing.T) {
	names, objs := cluster(4)
	f := newFixture(t, Options{}, objs...)
	for _, step := range []time.Duration{0, grace + time.Second, time.Minute} {
		f.clock.Step(step)
		for _, n := range names {
			f.syncNode(n)
		}
	}
	held := 0
	for _, ev := range f.drain() {
		if strings.HasPrefix(ev, "Warning GPUPluginMassLapse") && strings.Contains(ev, "4 of 4 nodes") && strings.Contains(ev, "not tainted at all") {
			held++
		} else {
			t.Errorf("unexpected event %q", ev)
		}
	}
	if held != len(names) {
		t.Errorf("%d mass lapse events, want one per node (%d)", held, len(names))
	}
	if v := metricstest.Value(t, f.reg, "gpu_dra_controller_outage_lapsed_nodes", nil); v != 4 {
		t.Errorf("lapsed nodes gauge %v, want 4", v)
	}
}
