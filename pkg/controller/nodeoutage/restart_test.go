package nodeoutage

import (
	"context"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// lastRenewal is the renewTime of leaseObj(lastRenewal), as a rule records it.
var lastRenewal = time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)

// ruleFor is the rule an earlier controller made for the Lease's renewal
// at renewed by holder plugin-abc.
func ruleFor(effect resourceapi.DeviceTaintEffect, renewed time.Time) *resourceapi.DeviceTaintRule {
	r := ruleObj(effect)
	r.Annotations = map[string]string{
		vocabulary.AnnotationOutageRenewTime: renewed.Format(metav1.RFC3339Micro),
		vocabulary.AnnotationOutageHolder:    "plugin-abc",
	}
	return r
}

// drain returns the events recorded so far.
func (f *fixture) drain() []string {
	var out []string
	for {
		select {
		case ev := <-f.events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// A dra-controller that restarts, or a replica that becomes leader, finds
// the rules an earlier one made while the plugins still do not renew: it
// keeps them, effect and all, and says nothing of serving again, until the
// Lease shows a renewal after the one the rule was made for.
func TestRestartKeepsRules(t *testing.T) {
	for name, tc := range map[string]struct {
		opts Options
		rule *resourceapi.DeviceTaintRule
		// want is the effect after the restart and after each step of
		// advance without a renewal.
		want    []resourceapi.DeviceTaintEffect
		advance time.Duration
	}{
		"NoSchedule": {
			rule: ruleFor(resourceapi.DeviceTaintEffectNoSchedule, lastRenewal),
			want: []resourceapi.DeviceTaintEffect{"NoSchedule", "NoSchedule", "NoSchedule"}, advance: time.Hour,
		},
		"NoExecute stays NoExecute": {
			opts: Options{NoExecuteAfter: 5 * time.Minute},
			rule: ruleFor(resourceapi.DeviceTaintEffectNoExecute, lastRenewal),
			want: []resourceapi.DeviceTaintEffect{"NoExecute", "NoExecute"}, advance: time.Second,
		},
		"NoSchedule escalates, counted from the restart": {
			opts: Options{NoExecuteAfter: 5 * time.Minute},
			rule: ruleFor(resourceapi.DeviceTaintEffectNoSchedule, lastRenewal),
			want: []resourceapi.DeviceTaintEffect{"NoSchedule", "NoExecute"}, advance: 5*time.Minute - grace,
		},
		"rule from before the record: kept, and recorded": {
			rule: ruleObj(resourceapi.DeviceTaintEffectNoSchedule),
			want: []resourceapi.DeviceTaintEffect{"NoSchedule", "NoSchedule"}, advance: time.Hour,
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, tc.opts, nodeObj(), sliceObj(), leaseObj(lastRenewal), tc.rule)
			for i, want := range tc.want {
				if i > 0 {
					f.clock.Step(tc.advance)
				}
				f.sync()
				if got := f.effect(); got != want {
					t.Errorf("step %d without a renewal: rule effect %q, want %q", i, got, want)
				}
			}
			for _, a := range f.client.Actions() {
				if a.GetResource().Resource == "devicetaintrules" && a.GetVerb() == "delete" {
					t.Errorf("the rule was deleted without a renewal")
				}
			}
			for _, ev := range f.drain() {
				if strings.Contains(ev, "GPUPluginServing") {
					t.Errorf("event without a renewal: %q", ev)
				}
			}
			r, err := f.client.ResourceV1().DeviceTaintRules().Get(context.Background(), vocabulary.OutageRuleName(node), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Annotations[vocabulary.AnnotationOutageRenewTime]; got != "2026-01-02T03:00:00.000000Z" {
				t.Errorf("rule records renewTime %q", got)
			}
			if got := r.Annotations[vocabulary.AnnotationOutageHolder]; got != "plugin-abc" {
				t.Errorf("rule records holder %q", got)
			}

			f.renew()
			f.sync()
			if got := f.effect(); got != "" {
				t.Errorf("after a renewal: rule effect %q, want none", got)
			}
			if evs := f.drain(); len(evs) != 1 || !strings.HasPrefix(evs[0], "Normal GPUPluginServing") {
				t.Errorf("events after a renewal %q, want one GPUPluginServing", evs)
			}
		})
	}
}

// A rule made for an older renewal than the Lease shows: the plugin renewed
// since (while no controller was leading), which is a real renewal.
func TestRestartAfterRenewal(t *testing.T) {
	f := newFixture(t, Options{}, nodeObj(), sliceObj(), leaseObj(lastRenewal),
		ruleFor(resourceapi.DeviceTaintEffectNoSchedule, lastRenewal.Add(-10*time.Second)))
	f.sync()
	if got := f.effect(); got != "" {
		t.Errorf("rule effect %q, want the rule lifted", got)
	}
}

// The rule records a later renewal than the Lease in the cache shows: the
// cache is behind (its watch, or the order of the lists at start), and no
// renewal after the rule's happened.
func TestRuleNewerThanCachedLease(t *testing.T) {
	f := newFixture(t, Options{}, nodeObj(), sliceObj(), leaseObj(lastRenewal),
		ruleFor(resourceapi.DeviceTaintEffectNoSchedule, lastRenewal.Add(10*time.Second)))
	f.sync()
	if got := f.effect(); got != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("rule effect %q, want the rule kept", got)
	}
	if evs := f.drain(); len(evs) != 0 {
		t.Errorf("events %q, want none", evs)
	}
	// The cache catches up with the renewal the rule was made for: still
	// none after it.
	f.renew()
	f.clock.Step(time.Second)
	f.sync()
	if got := f.effect(); got != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("once the cache caught up: rule effect %q, want the rule kept", got)
	}
	f.renew()
	f.sync()
	if got := f.effect(); got != "" {
		t.Errorf("after a renewal: rule effect %q, want none", got)
	}
}

// A rule made for another holder's renewal: another plugin process renewed
// since, even if its renewTime is not later (its node's clock went back).
func TestRuleForAnotherHolder(t *testing.T) {
	rule := ruleFor(resourceapi.DeviceTaintEffectNoSchedule, lastRenewal.Add(time.Hour))
	rule.Annotations[vocabulary.AnnotationOutageHolder] = "plugin-old"
	f := newFixture(t, Options{}, nodeObj(), sliceObj(), leaseObj(lastRenewal), rule)
	f.sync()
	if got := f.effect(); got != "" {
		t.Errorf("rule effect %q, want the rule lifted", got)
	}
}

// Two leaders for a moment: this controller first saw the Lease fresh,
// then the rule the other one made for that very renewal arrives. It is
// kept: no renewal happened since it was made.
func TestRuleFromAnotherLeader(t *testing.T) {
	objs := []runtime.Object{nodeObj(), sliceObj(), leaseObj(lastRenewal)}
	f := newFixture(t, Options{}, objs...)
	f.sync()
	if _, err := f.client.ResourceV1().DeviceTaintRules().Create(context.Background(),
		ruleFor(resourceapi.DeviceTaintEffectNoSchedule, lastRenewal), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.clock.Step(time.Second)
	f.sync()
	if got := f.effect(); got != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("rule effect %q, want the other leader's rule kept", got)
	}
	if evs := f.drain(); len(evs) != 0 {
		t.Errorf("events %q, want none", evs)
	}
}
