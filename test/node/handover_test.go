package node

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/kubelet"
	"github.com/gpu-dra/gpu-dra-driver/pkg/handover"
	"github.com/gpu-dra/gpu-dra-driver/pkg/prepare"
)

// A rolling update: the kubelet sends a prepare to the old instance while
// it drains (its connection to the new one is not up yet). The old
// instance forwards it to the new one, which prepares it once it owns the
// node; the kubelet gets the devices, not "handing over" (which it would
// record as FailedPrepareDynamicResources). The old instance's drain holds
// a prepare in flight (blocked at a fault point) so that the second
// prepare surely arrives during the drain.
func TestPrepareDuringDrainIsForwarded(t *testing.T) {
	ctx := context.Background()
	dirs, _, claims, _ := setup(t, map[string]int64{"inflight": 1, "during": 1})
	client := apiserver.NodeClient(nodeName, claims["inflight"], claims["during"])

	var armed atomic.Bool
	blocked, release := make(chan struct{}), make(chan struct{})
	oldCfg := dirs.Config(machine, nodeName)
	oldCfg.KubeClient, oldCfg.PodUID = client, "01d00000-0000-0000-0000-000000000001"
	oldCfg.FaultHook = func(point string) {
		if point == prepare.FaultPrepareCDIWritten && armed.CompareAndSwap(true, false) {
			close(blocked)
			<-release
		}
	}
	oldPlugin, err := inprocess.Start(ctx, oldCfg)
	if err != nil {
		t.Fatal(err)
	}
	var released atomic.Bool
	unblock := func() {
		if released.CompareAndSwap(false, true) {
			close(release)
		}
	}
	defer unblock()
	stopped, stopping := make(chan error, 1), false
	defer func() {
		if !stopping { // the test failed before it stopped the old instance
			_ = oldPlugin.Stop()
		}
	}()
	// The kubelet's connection to the old instance, which outlives its
	// stand-in's (inprocess.Stop closes that one first).
	k, err := kubelet.Register(ctx, oldCfg.RegistrarDir, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = k.Close() }()

	newCfg := dirs.Config(machine, nodeName)
	newCfg.KubeClient, newCfg.PodUID = client, "0e700000-0000-0000-0000-000000000002"
	newCfg.RegistrarDir = filepath.Join(dirs.Root, "reg-new") // inprocess.Start empties the registrar dir
	newPlugin, err := inprocess.Start(ctx, newCfg)            // registered, waiting for the lock
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = newPlugin.Stop() }()

	armed.Store(true)
	inflight := make(chan error, 1)
	go func() { _, err := k.PrepareOne(ctx, claims["inflight"]); inflight <- err }()
	select {
	case <-blocked:
	case err := <-inflight:
		t.Fatalf("the prepare to hold in flight returned: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the prepare to hold in flight did not reach its fault point")
	}
	stopping = true
	go func() { stopped <- oldPlugin.Stop() }() // SIGTERM: the old instance drains
	time.Sleep(time.Second)                     // Drain begins at once; it waits for the prepare in flight

	during := make(chan error, 1)
	var ids []string
	go func() {
		var err error
		ids, err = k.PrepareOne(ctx, claims["during"])
		during <- err
	}()
	select {
	case err := <-during:
		t.Fatalf("the prepare sent during the drain returned (%v) before the new instance owned the node", err)
	case <-time.After(time.Second):
	}
	unblock()
	if err := waitErr(t, inflight); err != nil {
		t.Fatalf("the prepare in flight when the drain began: %v", err)
	}
	if err := waitErr(t, during); err != nil {
		t.Fatalf("the prepare sent to the old instance during its drain: %v", err)
	}
	if len(ids) == 0 {
		t.Error("the prepare sent during the drain returned no CDI devices")
	}
	if err := waitErr(t, stopped); err != nil {
		t.Errorf("old instance: %v", err)
	}
	if o, err := handover.ReadOwner(dirs.PluginData); err != nil || o.PodUID != newCfg.PodUID {
		t.Errorf("owner after the hand-over = %+v, %v; want the new instance", o, err)
	}
	// The new instance prepared it: a repeat on its own socket is idempotent.
	again, err := newPlugin.Kubelet.PrepareOne(ctx, claims["during"])
	if err != nil || len(again) != len(ids) {
		t.Errorf("prepare again on the new instance = %v, %v; want %v", again, err, ids)
	}
}

func waitErr(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("no answer within 60s")
		return nil
	}
}
