package heartbeat

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const ns, node = "gpu-dra-driver", "gpu-node-1"

func lease(t *testing.T, client *fake.Clientset) *coordinationv1.Lease {
	t.Helper()
	l, err := client.CoordinationV1().Leases(ns).Get(context.Background(), vocabulary.HeartbeatLeaseName(node), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("heartbeat Lease: %v", err)
	}
	return l
}

// The Lease is created, renewed while Serving passes, left alone while it
// fails, and created again after someone deleted it.
func TestBeat(t *testing.T) {
	client := fake.NewClientset()
	var notServing error
	h, err := New(Options{Client: client.CoordinationV1(), Namespace: ns, NodeName: node, Holder: "plugin-abc",
		Period: 10 * time.Second, Serving: func() error { return notServing }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h.beat(ctx)
	first := lease(t, client)
	if first.Labels[vocabulary.LabelHeartbeat] != "true" || ptr.Deref(first.Spec.HolderIdentity, "") != "plugin-abc" ||
		ptr.Deref(first.Spec.LeaseDurationSeconds, 0) != 40 || first.Spec.RenewTime == nil || first.Spec.AcquireTime == nil {
		t.Fatalf("created Lease: %+v %+v", first.Labels, first.Spec)
	}
	renewed := func(after *metav1.MicroTime) bool {
		time.Sleep(2 * time.Millisecond) // MicroTime resolution
		h.beat(ctx)
		return lease(t, client).Spec.RenewTime.After(after.Time)
	}
	if !renewed(first.Spec.RenewTime) {
		t.Error("serving: not renewed")
	}
	notServing = errors.New("check dra-socket: no answer")
	last := lease(t, client).Spec.RenewTime
	if renewed(last) || renewed(last) {
		t.Error("not serving: renewed anyway")
	}
	notServing = nil
	if !renewed(last) {
		t.Error("serving again: not renewed")
	}
	if got := lease(t, client).Spec.AcquireTime; !got.Equal(first.Spec.AcquireTime) {
		t.Errorf("same holder: acquireTime changed from %v to %v", first.Spec.AcquireTime, got)
	}

	// dra-controller deletes the Lease of a node it thinks is gone.
	if err := client.CoordinationV1().Leases(ns).Delete(ctx, h.LeaseName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.beat(ctx) // fails: the Lease it had is gone
	h.beat(ctx)
	if l := lease(t, client); l.Labels[vocabulary.LabelHeartbeat] != "true" {
		t.Errorf("recreated Lease: %+v", l.Labels)
	}
}

func TestNewRejects(t *testing.T) {
	client := fake.NewClientset().CoordinationV1()
	serving := func() error { return nil }
	for name, tc := range map[string]struct {
		opts Options
		want string
	}{
		"no namespace":   {Options{Client: client, NodeName: node, Period: time.Second, Serving: serving}, "namespace"},
		"no node":        {Options{Client: client, Namespace: ns, Period: time.Second, Serving: serving}, "node name"},
		"zero period":    {Options{Client: client, Namespace: ns, NodeName: node, Serving: serving}, "period"},
		"no serving":     {Options{Client: client, Namespace: ns, NodeName: node, Period: time.Second}, "Serving"},
		"long node name": {Options{Client: client, Namespace: ns, NodeName: strings.Repeat("n", 240), Period: time.Second, Serving: serving}, "Lease name"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := New(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
