package campaign

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/kubelet"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// Stale claims (pkg/staleclaims): the child releases a claim whose
// ResourceClaim is gone or reallocated after staleGrace, unless the
// kubelet's PodResources API (served here, at podResourcesSocket) lists a
// container with it. The campaign's kubelet lists a container for every
// claim it holds prepared whose pod has not ended (claim.ended), so the
// plugin may never release one of those.
const (
	staleGrace         = time.Second
	podResourcesSocket = "podres.sock"
	// releaseWithin bounds a release: the grace period, two check
	// periods (one second each) and a margin for the loaded machine.
	releaseWithin = 15 * time.Second
)

// serveKubelet starts the campaign's PodResources API.
func (r *run) serveKubelet() {
	k, err := kubelet.ServePodResources(filepath.Join(r.dirs.Root, podResourcesSocket))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(k.Stop)
	r.kubelet, r.listed = k, map[string]func(){}
}

// syncKubelet lists a container for each prepared claim whose pod runs.
func (r *run) syncKubelet() {
	for uid, stop := range r.listed {
		if c := r.claims[uid]; c == nil || c.state != prepared || c.ended {
			stop()
			delete(r.listed, uid)
		}
	}
	for _, c := range r.sortedClaims() {
		if _, ok := r.listed[c.uid()]; !ok && c.state == prepared && !c.ended {
			r.listed[c.uid()] = r.kubelet.Run("pod-"+c.obj.Name, "ctr", c.obj, driverName)
		}
	}
}

// staleStep deletes a prepared claim's ResourceClaim behind the kubelet's
// back (a tenant removing its finalizer), with its container running
// (stale-live: the plugin must hold it past the grace period, and a claim
// the scheduler gives its GPU must not prepare) or ended (stale-dead), or
// reallocates it on this node to other devices under the same UID after
// its pod ended (stale-reallocated: the kubelet's prepare must succeed
// once the old preparation is released). Only with a plugin that is not
// armed and all GPUs there: a release is awaited.
func (r *run) staleStep() {
	var done []*claim
	for _, c := range r.sortedClaims() {
		if c.state == prepared {
			done = append(done, c)
		}
	}
	if r.armed != "" || len(r.lost) > 0 || len(r.nvmlArmed) > 0 || len(done) == 0 {
		r.batch(false)
		return
	}
	c := done[r.rng.IntN(len(done))]
	switch r.rng.IntN(3) {
	case 0:
		r.staleLive(c)
	case 1:
		r.fault("stale-dead", "("+c.obj.Name+")")
		c.ended = true
		r.deleteClaim(c)
		r.awaitRelease(c)
	default:
		r.staleReallocated(c)
	}
	r.syncKubelet()
	for _, v := range r.check(false) {
		r.violate("%s", v)
	}
}

func (r *run) deleteClaim(c *claim) {
	if err := os.Remove(claimFile(r.dirs.Root, c.obj.Namespace, c.obj.Name)); err != nil {
		r.t.Fatal(err)
	}
	// The scheduler no longer sees the claim's devices allocated.
	r.cluster.Release(c.obj)
}

func (r *run) staleLive(c *claim) {
	r.fault("stale-live", "("+c.obj.Name+")")
	r.deleteClaim(c)
	// A second tenant's claim on the same GPU, as the scheduler would now
	// allocate it (whole GPUs only: other kinds may fit beside).
	var second *claim
	if c.kind == kindGPU {
		second = r.pinnedGPU(c.gpus()[0])
	}
	time.Sleep(staleGrace + 2500*time.Millisecond) // past the grace period and two checks
	if e, ok := r.prepared(c); !ok || e.State != checkpoint.PrepareCompleted {
		r.violate("stale-live: claim %s released while its container runs", c.obj.Name)
	}
	if second != nil {
		r.prepareSecond(second, false)
	}
	c.ended = true
	r.syncKubelet()
	r.awaitRelease(c)
	if second != nil {
		r.prepareSecond(second, true)
	}
}

// pinnedGPU allocates a whole-GPU claim on GPU g; nil if it does not fit.
func (r *run) pinnedGPU(g int) *claim {
	r.names++
	obj := at.Claim(fmt.Sprintf("c%d-second", r.names), at.Exactly("gpu", driverName, 1, fmt.Sprintf(`device.attributes["gpu.dra.dev"].minor == %d`, g)))
	out, err := r.cluster.Allocate(context.Background(), nodeName, obj)
	if err != nil {
		r.t.Fatalf("allocate %s: %v", obj.Name, err)
	}
	if out == nil {
		return nil
	}
	if err := publishClaim(r.dirs.Root, out[0]); err != nil {
		r.t.Fatal(err)
	}
	c := &claim{obj: out[0], kind: kindGPU, state: pendingPrepare, born: r.ops}
	r.claims[c.uid()] = c
	return c
}

// prepareSecond prepares the second tenant's claim: it must fail while
// the first claim is held and succeed once it is released.
func (r *run) prepareSecond(c *claim, wantOK bool) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	ids, err := r.child.Kubelet.PrepareOne(ctx, c.obj)
	r.ops++
	switch {
	case err == nil && !wantOK:
		r.violate("stale-live: claim %s prepared on GPU %v while the held claim's container runs", c.obj.Name, c.gpus())
		c.state, c.ids = prepared, ids
	case err == nil:
		c.state, c.ids = prepared, ids
	case wantOK:
		r.violate("stale-live: claim %s not prepared after the held claim's release: %v", c.obj.Name, err)
	}
}

// staleReallocated: the claim's pod ended, the kubelet lost its record,
// and the claim was allocated again under the same UID.
func (r *run) staleReallocated(c *claim) {
	r.fault("stale-reallocated", "("+c.obj.Name+")")
	c.ended = true
	r.syncKubelet()
	r.cluster.Release(c.obj)
	fresh := c.obj.DeepCopy()
	fresh.Status.Allocation = nil
	attr := "minor"
	if c.kind == kindMIG {
		attr = "parentMinor"
	}
	for _, g := range c.gpus() { // other devices: the case prepare refuses
		for i := range fresh.Spec.Devices.Requests {
			if ex := fresh.Spec.Devices.Requests[i].Exactly; ex != nil {
				ex.Selectors = append(ex.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf(`device.attributes["gpu.dra.dev"].%s != %d`, attr, g)}})
			}
		}
	}
	out, err := r.cluster.Allocate(context.Background(), nodeName, fresh)
	if err != nil {
		r.t.Fatal(err)
	}
	if out == nil { // nothing else fits: its pod is gone, the claim too
		r.deleteClaimFile(c)
		r.awaitRelease(c)
		return
	}
	if err := publishClaim(r.dirs.Root, out[0]); err != nil {
		r.t.Fatal(err)
	}
	c.obj, c.ended = out[0], false
	deadline := time.Now().Add(releaseWithin)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		ids, err := r.child.Kubelet.PrepareOne(ctx, c.obj)
		cancel()
		r.ops++
		if err == nil {
			c.state, c.ids = prepared, ids
			return
		}
		if time.Now().After(deadline) {
			r.violate("stale-reallocated: claim %s (now %v) not prepared %s after its reallocation: %v", c.obj.Name, c.devices(), releaseWithin, err)
			c.state = pendingPrepare
			return
		}
		time.Sleep(500 * time.Millisecond) // the kubelet's retry
	}
}

func (r *run) deleteClaimFile(c *claim) {
	if err := os.Remove(claimFile(r.dirs.Root, c.obj.Namespace, c.obj.Name)); err != nil {
		r.t.Fatal(err)
	}
}

// awaitRelease waits until the plugin released c and drops it from the
// model, as the kubelet never unprepares it.
func (r *run) awaitRelease(c *claim) {
	r.syncKubelet()
	deadline := time.Now().Add(releaseWithin)
	for {
		if _, ok := r.prepared(c); !ok {
			break
		}
		if time.Now().After(deadline) {
			r.violate("stale claim %s not released %s after its container ended", c.obj.Name, releaseWithin)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	delete(r.claims, c.uid())
}

// prepared returns c's checkpoint entry.
func (r *run) prepared(c *claim) (*checkpoint.PreparedClaim, bool) {
	cp, err := loadCheckpoint(r.dirs)
	if err != nil {
		r.violate("read the checkpoint: %v", err)
		return nil, true
	}
	return cp.Get(c.obj.UID)
}
