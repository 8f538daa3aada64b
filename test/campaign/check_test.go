package campaign

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/passthrough"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

func ctxBackground() context.Context { return context.Background() }

// shareState is the part of a sharing manager's per-GPU state file the
// campaign reads: the GPU and the shares using it.
type shareState struct {
	UUID   string   `json:"uuid"`
	Shares []string `json:"shares"`
}

// nodeView is what is on the node: checkpoint, specs, hardware, daemons.
type nodeView struct {
	cp    *checkpoint.Checkpoint
	specs map[string]cdi.ClaimSpecInfo
	cache *cdiapi.Cache
	// instances are the MIG GPU instances per GPU, as "uuid/giID".
	instances []string
	ts, mps   map[string]shareState // by state file
	// daemons are the MPS state dirs with a running control daemon.
	daemons   map[string]bool
	timeslice map[int]int
	exclusive map[int]bool
	// binding is each GPU's PCI driver and driver_override, by PCI address.
	binding map[string]pciBinding
	// imex are the compute domains' IMEX daemons, by domain UID.
	imex map[string]*domainDaemon
}

type pciBinding struct{ driver, override string }

func readNode(dirs pluginrun.Dirs, uuids []string) (*nodeView, error) {
	v := &nodeView{specs: map[string]cdi.ClaimSpecInfo{}, daemons: map[string]bool{}, timeslice: map[int]int{}, exclusive: map[int]bool{}}
	var err error
	if v.cp, err = loadCheckpoint(dirs); err != nil {
		return nil, fmt.Errorf("load checkpoint: %w", err)
	}
	specs, err := cdi.NewWriter(dirs.CDI, "", nil).ListClaimSpecs(ctxBackground())
	if err != nil {
		return nil, err
	}
	for _, s := range specs {
		v.specs[string(s.Claim.UID)] = s
	}
	if v.cache, err = cdiapi.NewCache(cdiapi.WithSpecDirs(dirs.CDI), cdiapi.WithAutoRefresh(false)); err != nil {
		return nil, fmt.Errorf("CDI cache: %w", err)
	}
	m, err := simMachine(dirs)
	if err != nil {
		return nil, err
	}
	defer m.Shutdown()
	for i, uuid := range uuids {
		for _, gi := range m.GpuInstances(i) {
			v.instances = append(v.instances, fmt.Sprintf("%s/%d", uuid, gi.ID))
		}
		v.timeslice[i] = m.Timeslice(i)
		if dev, ret := m.DeviceGetHandleByIndex(i); ret == nvml.SUCCESS {
			if mode, ret := dev.GetComputeMode(); ret == nvml.SUCCESS {
				v.exclusive[i] = mode == nvml.COMPUTEMODE_EXCLUSIVE_PROCESS
			}
		}
	}
	if v.ts, err = readShareStates(filepath.Join(dirs.PluginData, "timeslicing", "*.json")); err != nil {
		return nil, err
	}
	if v.mps, err = readShareStates(filepath.Join(dirs.Root, "mps", "*", "state.json")); err != nil {
		return nil, err
	}
	if v.binding, err = readBinding(filepath.Join(dirs.PluginData, "simulated-"+machine, "sys")); err != nil {
		return nil, err
	}
	if v.imex, err = readIMEX(dirs); err != nil {
		return nil, err
	}
	pids, _ := filepath.Glob(filepath.Join(dirs.Root, "mps", "*", "pipe", "nvidia-cuda-mps-control.pid"))
	for _, p := range pids {
		if pid := readPid(p); pid > 0 && syscall.Kill(pid, 0) == nil {
			v.daemons[filepath.Dir(filepath.Dir(p))] = true
		}
	}
	return v, nil
}

// readBinding reads the simulated sysfs's PCI devices (the GPUs).
func readBinding(root string) (map[string]pciBinding, error) {
	entries, err := os.ReadDir(filepath.Join(root, "bus/pci/devices"))
	if err != nil {
		return nil, fmt.Errorf("simulated sysfs: %w", err)
	}
	sys := passthrough.Sysfs{Root: root}
	out := map[string]pciBinding{}
	for _, e := range entries {
		driver, err := sys.Driver(e.Name())
		if err != nil {
			return nil, err
		}
		override, err := os.ReadFile(filepath.Join(root, "bus/pci/devices", e.Name(), "driver_override"))
		if err != nil {
			return nil, err
		}
		o := strings.TrimSpace(string(override))
		if o == "(null)" {
			o = ""
		}
		out[e.Name()] = pciBinding{driver: driver, override: o}
	}
	return out, nil
}

func readShareStates(pattern string) (map[string]shareState, error) {
	files, _ := filepath.Glob(pattern)
	out := map[string]shareState{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var s shareState
		if err := json.Unmarshal(data, &s); err != nil {
			return nil, fmt.Errorf("sharing state %s: %w", f, err)
		}
		out[f] = s
	}
	return out, nil
}

func readPid(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

// shareOwner is the claim UID a sharing manager's share ID starts with.
func shareOwner(id string) string {
	uid, _, _ := strings.Cut(id, "/")
	return uid
}

// check returns the invariant violations of the node against the model.
// afterRestart adds what a restart must have established: no half-done
// claims and a spec exactly for each completed claim.
func (r *run) check(afterRestart bool) []string {
	v, err := readNode(r.dirs, r.uuids)
	if err != nil {
		return []string{fmt.Sprintf("cannot read the node: %v", err)}
	}
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }

	// Nothing lost: each prepared claim is completed, with its devices,
	// its spec and the IDs the kubelet got.
	for _, c := range r.sortedClaims() {
		if c.state != prepared {
			continue
		}
		e, ok := v.cp.Get(c.obj.UID)
		switch {
		case !ok:
			fail("claim lost: prepared claim %s (%s, %v) has no checkpoint entry", c.obj.Name, c.kind, c.devices())
			// Reported once; the kubelet unprepares it some day.
			c.state = pendingUnprepare
			continue
		case e.State != checkpoint.PrepareCompleted:
			fail("claim lost: prepared claim %s is %s in the checkpoint", c.obj.Name, e.State)
		}
		var got []string
		for _, d := range e.Devices {
			got = append(got, d.Device)
		}
		slices.Sort(got)
		if !slices.Equal(got, c.devices()) {
			fail("claim %s: checkpoint holds devices %v, its allocation is %v", c.obj.Name, got, c.devices())
		}
		if s, ok := v.specs[c.uid()]; !ok {
			fail("claim lost: prepared claim %s has no CDI spec", c.obj.Name)
		} else if s.Err != nil {
			fail("claim lost: CDI spec of prepared claim %s is unusable: %v", c.obj.Name, s.Err)
		}
		for _, id := range c.ids {
			if v.cache.GetDevice(id) == nil {
				fail("claim lost: CDI device %s of prepared claim %s does not resolve", id, c.obj.Name)
			}
		}
		r.checkShares(v, c, fail)
		for _, d := range e.Devices {
			if b := v.binding[d.VFIOPCIBusID]; d.VFIOPCIBusID != "" && b.driver != passthrough.DriverVFIO {
				fail("claim lost: GPU %s of prepared passthrough claim %s is bound to %q, not vfio-pci", d.VFIOPCIBusID, c.obj.Name, b.driver)
			}
		}
		for _, d := range e.Devices {
			if d.MIG != nil && !d.AdminAccess && !slices.Contains(v.instances, fmt.Sprintf("%s/%d", d.MIG.ParentUUID, d.MIG.GIID)) {
				fail("claim lost: MIG instance %d on %s of prepared claim %s is gone", d.MIG.GIID, d.MIG.ParentUUID, c.obj.Name)
			}
		}
	}

	// Nothing leaked: checkpoint entries, specs, MIG instances, daemons and
	// settings all belong to a claim the kubelet has not unprepared.
	// Undoing work on a GPU that was lost when the running plugin started
	// waits for a start with the GPU back: its half-done claims and its
	// instances without a claim are not (yet) violations.
	deferred := map[string]bool{}
	for g := range r.unpublished {
		deferred[r.uuids[g]] = true
	}
	onDeferredGPU := func(e *checkpoint.PreparedClaim) bool {
		for _, d := range e.Devices {
			if deferred[d.GPUUUID] || (d.MIG != nil && deferred[d.MIG.ParentUUID]) {
				return true
			}
		}
		return false
	}
	checkNoDeviceTwice(v.cp, fail)
	owned := map[string]string{} // MIG instance -> claim UID
	for uid, e := range v.cp.All() {
		if r.claims[string(uid)] == nil {
			fail("leak: checkpoint entry %s (%s/%s, %s) belongs to no live claim", uid, e.Namespace, e.Name, e.State)
		}
		if afterRestart && e.State != checkpoint.PrepareCompleted && !onDeferredGPU(e) {
			fail("claim %s/%s left %s after a restart", e.Namespace, e.Name, e.State)
		}
		for _, d := range e.Devices {
			if d.MIG != nil && !d.AdminAccess {
				owned[fmt.Sprintf("%s/%d", d.MIG.ParentUUID, d.MIG.GIID)] = string(uid)
			}
		}
	}
	for uid, s := range v.specs {
		if r.claims[uid] == nil {
			fail("leak: CDI spec %s belongs to no live claim", filepath.Base(s.Path))
		}
		if e, ok := v.cp.Get(s.Claim.UID); afterRestart && (!ok || e.State != checkpoint.PrepareCompleted) {
			fail("orphaned CDI spec %s after a restart", filepath.Base(s.Path))
		}
	}
	for path, errs := range v.cache.GetErrors() {
		fail("unusable CDI spec %s: %v", filepath.Base(path), errs)
	}
	for _, inst := range v.instances {
		if slices.Contains(r.static, inst) {
			continue
		}
		parent, _, _ := strings.Cut(inst, "/")
		if uid, ok := owned[inst]; (!ok || r.claims[uid] == nil) && !deferred[parent] {
			fail("leak: MIG instance %s is neither static nor held by a live claim", inst)
		}
	}
	for _, inst := range r.static {
		if !slices.Contains(v.instances, inst) {
			fail("static MIG instance %s was destroyed", inst)
		}
	}
	for kind, states := range map[string]map[string]shareState{"time-slicing": v.ts, "MPS": v.mps} {
		for _, s := range states {
			for _, id := range s.Shares {
				if r.claims[shareOwner(id)] == nil {
					fail("leak: %s share %s on %s belongs to no live claim", kind, id, s.UUID)
				}
			}
		}
	}
	r.checkExclusive(v, fail)
	r.checkBinding(v, fail)
	r.checkChannels(v, fail)
	for dir := range v.daemons {
		if s := v.mps[filepath.Join(dir, "state.json")]; len(s.Shares) == 0 {
			fail("leak: an MPS control daemon runs in %s without shares", filepath.Base(dir))
		}
	}
	for i, uuid := range r.uuids {
		if v.timeslice[i] != 0 && !hasShares(v.ts, uuid) {
			fail("leak: GPU %d keeps time-slice level %d without time-slicing shares", i, v.timeslice[i])
		}
		if v.exclusive[i] && !hasShares(v.mps, uuid) {
			fail("leak: GPU %d stays in EXCLUSIVE_PROCESS without MPS shares", i)
		}
	}
	return bad
}

// checkBinding: a GPU off the nvidia driver, or with a driver_override
// left, is held for passthrough by a live claim's checkpoint entry (its
// prepare or unprepare may be under way or waiting for a retry).
func (r *run) checkBinding(v *nodeView, fail func(string, ...any)) {
	held := map[string]bool{}
	for uid, e := range v.cp.All() {
		if r.claims[string(uid)] == nil {
			continue
		}
		for _, d := range e.Devices {
			held[d.VFIOPCIBusID] = d.VFIOPCIBusID != ""
		}
	}
	for _, bdf := range slices.Sorted(maps.Keys(v.binding)) {
		b := v.binding[bdf]
		if (b.driver != passthrough.DriverNVIDIA || b.override != "") && !held[bdf] {
			fail("leak: GPU %s is bound to %q with driver_override %q, held by no live claim", bdf, b.driver, b.override)
		}
	}
}

// checkShares checks that a prepared share is registered with its manager
// and, for MPS, that its GPU's daemon runs.
func (r *run) checkShares(v *nodeView, c *claim, fail func(string, ...any)) {
	states := v.ts
	if c.kind == kindMPS {
		states = v.mps
	} else if c.kind != kindTS {
		return
	}
	for path, s := range states {
		for _, id := range s.Shares {
			if shareOwner(id) == c.uid() {
				if c.kind == kindMPS && !v.daemons[filepath.Dir(path)] {
					fail("claim lost: no MPS control daemon runs for prepared share %s on %s", c.obj.Name, s.UUID)
				}
				return
			}
		}
	}
	fail("claim lost: prepared %s share %s is not registered with its manager", c.kind, c.obj.Name)
}

func hasShares(states map[string]shareState, uuid string) bool {
	for _, s := range states {
		if s.UUID == uuid && len(s.Shares) > 0 {
			return true
		}
	}
	return false
}

// checkExclusive: no device is prepared for two claims while either's
// container runs (the kubelet holds it prepared and its pod has not
// ended), and a whole GPU prepared for one is prepared for no other claim
// in any form. Admin access (admin_test.go) is beside its holder, not a
// second holder. An IMEX channel is held by the claims of one domain
// (checkChannels).
func (r *run) checkExclusive(v *nodeView, fail func(string, ...any)) {
	holders := map[string]string{} // device#share -> claim
	onGPU := map[string][]string{} // GPU UUID -> claims with a device on it
	whole := map[string]string{}   // GPU UUID -> claim holding it whole
	for _, c := range r.sortedClaims() {
		e, ok := v.cp.Get(c.obj.UID)
		if c.state != prepared || c.ended || !ok {
			continue
		}
		for _, d := range e.Devices {
			if d.AdminAccess || d.Kind == vocabulary.KindIMEXChannel {
				continue
			}
			key := d.Device + "#" + d.ShareID
			if other, dup := holders[key]; dup && other != c.obj.Name {
				fail("device %s prepared for claims %s and %s while their containers run", key, other, c.obj.Name)
			}
			holders[key] = c.obj.Name
			if !slices.Contains(onGPU[d.GPUUUID], c.obj.Name) {
				onGPU[d.GPUUUID] = append(onGPU[d.GPUUUID], c.obj.Name)
			}
			if d.Kind == vocabulary.KindGPU && d.ShareID == "" {
				whole[d.GPUUUID] = c.obj.Name
			}
		}
	}
	for uuid, name := range whole {
		if len(onGPU[uuid]) > 1 {
			fail("GPU %s prepared whole for claim %s and also for %v while their containers run", uuid, name, onGPU[uuid])
		}
	}
}
