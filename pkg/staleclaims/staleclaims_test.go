package staleclaims

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/component-base/metrics"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const (
	driver = "gpu.dra.dev"
	node   = "node-1"
	grace  = 5 * time.Minute
)

// engine holds prepared claims as the prepare engine does.
type engine struct {
	mu       sync.Mutex
	claims   []checkpoint.PreparedClaim
	released []types.UID
}

func (e *engine) PreparedClaims() []checkpoint.PreparedClaim {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]checkpoint.PreparedClaim(nil), e.claims...)
}

func (e *engine) ReleaseClaim(ctx context.Context, obj kubeletplugin.NamespacedObject, stillStale func(context.Context) error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := stillStale(ctx); err != nil {
		return err
	}
	for i, c := range e.claims {
		if c.UID == obj.UID && c.Name == obj.Name && c.Namespace == obj.Namespace {
			e.claims = append(e.claims[:i], e.claims[i+1:]...)
			e.released = append(e.released, c.UID)
		}
	}
	return nil
}

func prepared() checkpoint.PreparedClaim {
	return checkpoint.PreparedClaim{
		UID: "uid-1", Namespace: "stale", Name: "g", State: checkpoint.PrepareCompleted,
		Devices: []checkpoint.PreparedDevice{{Request: "gpu", Pool: node, Device: "gpu-0"}},
	}
}

// claim is the API's ResourceClaim of prepared(), allocated to pool.
func claim(uid types.UID, pools ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "stale", Name: "g", UID: uid}}
	if len(pools) > 0 {
		c.Status.Allocation = &resourceapi.AllocationResult{}
	}
	for _, pool := range pools {
		d := driver
		if pool == "other-driver" {
			d, pool = "other.example.com", node
		}
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: d, Pool: pool, Device: "gpu-0"})
	}
	return c
}

// A compute domain's channel is allocated from its clique's channel pool,
// not the node's (docs/compute-domains.md).
var (
	cliquePool = vocabulary.ChannelPoolName("cluster-a.1")
	otherPool  = vocabulary.ChannelPoolName("cluster-b.1")
)

// preparedChannel is a prepared channel claim of the clique's pool.
func preparedChannel() checkpoint.PreparedClaim {
	return checkpoint.PreparedClaim{
		UID: "uid-1", Namespace: "stale", Name: "g", State: checkpoint.PrepareCompleted,
		Devices: []checkpoint.PreparedDevice{{Request: "channel", Pool: cliquePool, Device: "channel-3", Kind: vocabulary.KindIMEXChannel,
			IMEXChannel: &checkpoint.IMEXChannel{Channel: 3, DomainNamespace: "stale", DomainName: "training", DomainUID: "training-uid"}}},
	}
}

// channelClaim is the API's ResourceClaim of preparedChannel(), allocated
// to channel device of pool.
func channelClaim(pool, device string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "stale", Name: "g", UID: "uid-1"}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "channel", Driver: driver, Pool: pool, Device: device}},
	}}
	return c
}

// gets makes the n-th GET of the claim (from 1) answer answer(n).
func gets(answer func(n int) (*resourceapi.ResourceClaim, error)) func(k8stesting.Action) (bool, runtime.Object, error) {
	var mu sync.Mutex
	n := 0
	return func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		n++
		c, err := answer(n)
		if c == nil && err == nil {
			err = apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "g")
		}
		return true, c, err
	}
}

func TestCheck(t *testing.T) {
	for name, tc := range map[string]struct {
		api func(n int) (*resourceapi.ResourceClaim, error) // nil, nil: NotFound
		// channel: the prepared claim is preparedChannel(), not prepared().
		channel bool
		// wantReason is the release's reason, "" for none.
		wantReason string
	}{
		"deleted":               {api: func(int) (*resourceapi.ResourceClaim, error) { return nil, nil }, wantReason: ReasonDeleted},
		"replaced":              {api: func(int) (*resourceapi.ResourceClaim, error) { return claim("uid-2", node), nil }, wantReason: ReasonReplaced},
		"deallocated":           {api: func(int) (*resourceapi.ResourceClaim, error) { return claim("uid-1"), nil }, wantReason: ReasonNotAllocated},
		"allocated to node-2":   {api: func(int) (*resourceapi.ResourceClaim, error) { return claim("uid-1", "node-2"), nil }, wantReason: ReasonNotAllocated},
		"only another driver's": {api: func(int) (*resourceapi.ResourceClaim, error) { return claim("uid-1", "other-driver"), nil }, wantReason: ReasonNotAllocated},
		"allocated here":        {api: func(int) (*resourceapi.ResourceClaim, error) { return claim("uid-1", "node-2", node), nil }},
		"allocated here to another device": {api: func(int) (*resourceapi.ResourceClaim, error) {
			c := claim("uid-1", node)
			c.Status.Allocation.Devices.Results[0].Device = "gpu-1"
			return c, nil
		}, wantReason: ReasonReallocated},
		"allocated here to one more device": {api: func(int) (*resourceapi.ResourceClaim, error) {
			c := claim("uid-1", node, node)
			c.Status.Allocation.Devices.Results[1].Device = "gpu-1"
			return c, nil
		}, wantReason: ReasonReallocated},
		"API error": {api: func(int) (*resourceapi.ResourceClaim, error) { return nil, apierrors.NewInternalError(errTest) }},
		"forbidden": {api: func(int) (*resourceapi.ResourceClaim, error) {
			return nil, apierrors.NewForbidden(schema.GroupResource{}, "g", errTest)
		}},
		"API error at re-check": {api: func(n int) (*resourceapi.ResourceClaim, error) { return nil, map[bool]error{true: errTest}[n > 3] }},
		"allocated at re-check": {api: func(n int) (*resourceapi.ResourceClaim, error) {
			return map[bool]*resourceapi.ResourceClaim{true: claim("uid-1", node)}[n > 3], nil
		}},
		"back within the grace": {api: func(n int) (*resourceapi.ResourceClaim, error) {
			return map[bool]*resourceapi.ResourceClaim{true: claim("uid-1", node)}[n == 2], nil
		}},
		"error within the grace": {api: func(n int) (*resourceapi.ResourceClaim, error) { return nil, map[bool]error{true: errTest}[n == 2] }, wantReason: ReasonDeleted},
		"channel allocated to it": {channel: true, api: func(int) (*resourceapi.ResourceClaim, error) {
			return channelClaim(cliquePool, "channel-3"), nil
		}},
		"channel allocated to another channel": {channel: true, api: func(int) (*resourceapi.ResourceClaim, error) {
			return channelClaim(cliquePool, "channel-4"), nil
		}, wantReason: ReasonReallocated},
		"channel allocated in another clique": {channel: true, api: func(int) (*resourceapi.ResourceClaim, error) {
			return channelClaim(otherPool, "channel-3"), nil
		}, wantReason: ReasonNotAllocated},
		"channel deallocated": {channel: true, api: func(int) (*resourceapi.ResourceClaim, error) { return claim("uid-1"), nil }, wantReason: ReasonNotAllocated},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			client := apiserver.NodeClient(node)
			client.PrependReactor("get", "resourceclaims", gets(tc.api))
			entry := prepared()
			if tc.channel {
				entry = preparedChannel()
			}
			e := &engine{claims: []checkpoint.PreparedClaim{entry}}
			clock := clocktesting.NewFakePassiveClock(time.Unix(1e9, 0))
			r, err := New(Options{Client: client, Engine: e, DriverName: driver, PoolName: node, NodeName: node, GracePeriod: grace, Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			reg := metrics.NewKubeRegistry()
			r.Metrics().MustRegister(reg)

			// GETs: 1 first seen; 2 within the grace; 3 after it, 4 the re-check.
			for _, step := range []time.Duration{0, grace / 2, grace / 2} {
				clock.SetTime(clock.Now().Add(step))
				r.Check(ctx)
				if clock.Now().Sub(time.Unix(1e9, 0)) < grace && len(e.released) > 0 {
					t.Fatalf("released after %s, within the grace period", clock.Now().Sub(time.Unix(1e9, 0)))
				}
			}
			want := tc.wantReason != ""
			if got := len(e.released) == 1; got != want {
				t.Fatalf("released: %v, want %v", got, want)
			}
			events, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !want {
				if len(events.Items) != 0 {
					t.Errorf("events for a claim not released: %v", events.Items)
				}
				return
			}
			if len(events.Items) != 1 {
				t.Fatalf("%d events, want 1", len(events.Items))
			}
			ev := events.Items[0]
			if ev.InvolvedObject.Kind != "Node" || ev.InvolvedObject.Name != node || ev.Reason != EventReason {
				t.Errorf("event on %s %s with reason %s, want Node %s, %s", ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Reason, node, EventReason)
			}
			for _, s := range []string{"stale/g", "uid-1", entry.Devices[0].Device} {
				if !strings.Contains(ev.Message, s) {
					t.Errorf("event message %q does not name %s", ev.Message, s)
				}
			}
			if got := released(t, reg); got != "reason="+tc.wantReason+":1" {
				t.Errorf("stale_claims_released_total: %s, want reason=%s:1", got, tc.wantReason)
			}
		})
	}
}

var errTest = errors.New("the API server is unavailable")

// TestCheckForgetsUnprepared: a claim the kubelet unprepares within the
// grace period starts a new grace period if it comes back stale.
func TestCheckForgetsUnprepared(t *testing.T) {
	ctx := t.Context()
	e := &engine{claims: []checkpoint.PreparedClaim{prepared()}}
	clock := clocktesting.NewFakePassiveClock(time.Unix(1e9, 0))
	r, err := New(Options{Client: apiserver.NodeClient(node), Engine: e, DriverName: driver, PoolName: node, NodeName: node, GracePeriod: grace, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	r.Check(ctx)
	e.claims = nil
	clock.SetTime(clock.Now().Add(grace / 2))
	r.Check(ctx)
	e.claims = []checkpoint.PreparedClaim{prepared()}
	clock.SetTime(clock.Now().Add(grace / 2))
	if r.Check(ctx) != 0 || len(e.released) != 0 {
		t.Fatal("released a claim seen stale for less than the grace period")
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	base := Options{Client: apiserver.NodeClient(node), Engine: &engine{}, DriverName: driver, PoolName: node, NodeName: node, GracePeriod: grace}
	for name, mutate := range map[string]func(*Options){
		"no client":       func(o *Options) { o.Client = nil },
		"no engine":       func(o *Options) { o.Engine = nil },
		"no pool":         func(o *Options) { o.PoolName = "" },
		"zero grace":      func(o *Options) { o.GracePeriod = 0 },
		"negative period": func(o *Options) { o.Period = -time.Second },
	} {
		opts := base
		mutate(&opts)
		if _, err := New(opts); err == nil {
			t.Errorf("%s: New accepted %+v", name, opts)
		}
	}
}

// released lists the counter's samples as reason=R:V.
func released(t *testing.T, reg metrics.Gatherer) string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if f.GetName() != "gpu_dra_plugin_stale_claims_released_total" {
				continue
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					out = append(out, fmt.Sprintf("reason=%s:%v", l.GetValue(), m.GetCounter().GetValue()))
				}
			}
		}
	}
	return strings.Join(out, ",")
}

// TestCheckReleasesSeveral: claims stale together are released in one
// check, each with its own event.
func TestCheckReleasesSeveral(t *testing.T) {
	ctx := t.Context()
	a, b := prepared(), prepared()
	b.UID, b.Name = "uid-2", "h"
	e := &engine{claims: []checkpoint.PreparedClaim{a, b}}
	client := apiserver.NodeClient(node)
	clock := clocktesting.NewFakePassiveClock(time.Unix(1e9, 0))
	r, err := New(Options{Client: client, Engine: e, DriverName: driver, PoolName: node, NodeName: node, GracePeriod: grace, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	r.Check(ctx)
	clock.SetTime(clock.Now().Add(grace))
	if n := r.Check(ctx); n != 2 || len(e.released) != 2 {
		t.Fatalf("released %d (%v), want both", n, e.released)
	}
	events, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(events.Items) != 2 {
		t.Errorf("%d events for 2 releases", len(events.Items))
	}
}
