package nvmlsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// stateVersion is the version of the state file format.
const stateVersion = 1

// GpuInstanceState describes a GPU instance, as GpuInstances returns it and the state file
// stores it.
type GpuInstanceState struct {
	ID        uint32 `json:"id"`
	ProfileID uint32 `json:"profileId"`
	// Profile is the profile's name, e.g. "1g.10gb" (informative in the state file).
	Profile          string                 `json:"profile"`
	Start            uint32                 `json:"start"`
	Size             uint32                 `json:"size"`
	ComputeInstances []ComputeInstanceState `json:"computeInstances,omitempty"`
}

// ComputeInstanceState describes a compute instance and its MIG device.
type ComputeInstanceState struct {
	ID        uint32 `json:"id"`
	ProfileID uint32 `json:"profileId"`
	// Profile is the profile's name, e.g. "1c.3g.20gb" or "3g.20gb" (informative in the file).
	Profile string `json:"profile"`
	Start   uint32 `json:"start"`
	Size    uint32 `json:"size"`
	// UUID is the MIG device's UUID (informative in the file: it is derived, not loaded).
	UUID string `json:"uuid"`
}

type persistedGPU struct {
	Index          int                `json:"index"`
	UUID           string             `json:"uuid"`
	MigMode        int                `json:"migMode"`
	MigModePending int                `json:"migModePending"`
	ComputeMode    int                `json:"computeMode"`
	Timeslice      int                `json:"timeslice"`
	Lost           bool               `json:"lost,omitempty"`
	EccCorrected   uint64             `json:"eccCorrected,omitempty"`
	EccUncorrected uint64             `json:"eccUncorrected,omitempty"`
	RecoveryAction int                `json:"recoveryAction,omitempty"`
	GpuInstances   []GpuInstanceState `json:"gpuInstances,omitempty"`
}

type persistedState struct {
	Version int    `json:"version"`
	Machine string `json:"machine"`
	Seed    string `json:"seed"`
	// Boots counts simulated reboots (the boot ID derives from it).
	Boots int            `json:"boots,omitempty"`
	GPUs  []persistedGPU `json:"gpus"`
}

// gpuAt returns GPU index. m.mu must be held.
func (m *Machine) gpuAt(index int) (*gpu, error) {
	if index < 0 || index >= len(m.gpus) {
		return nil, fmt.Errorf("GPU index %d out of range: machine %s has %d GPUs", index, m.spec.name, len(m.gpus))
	}
	return m.gpus[index], nil
}

func (gi *gpuInstance) state() GpuInstanceState {
	s := GpuInstanceState{ID: gi.id, ProfileID: gi.profile.id, Profile: gi.profile.name, Start: gi.start, Size: gi.profile.size}
	for _, ci := range gi.sortedComputeInstances() {
		s.ComputeInstances = append(s.ComputeInstances, ComputeInstanceState{
			ID: ci.id, ProfileID: uint32(ci.profile.index), Profile: ci.profile.name,
			Start: ci.start, Size: ci.profile.slices, UUID: ci.uuid,
		})
	}
	return s
}

// GpuInstances returns the GPU instances of GPU gpuIndex with their compute instances, ordered
// by ID; nil for an unknown GPU. It is a read-only view for tests.
func (m *Machine) GpuInstances(gpuIndex int) []GpuInstanceState {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, err := m.gpuAt(gpuIndex)
	if err != nil {
		return nil
	}
	var out []GpuInstanceState
	for _, gi := range g.sortedGpuInstances() {
		out = append(out, gi.state())
	}
	return out
}

// SetTimeslice sets the compute time-slice level of GPU gpuIndex, as
// `nvidia-smi compute-policy -i <gpu> --set-timeslice=<level>` does on real GPUs (0 default,
// 1 short, 2 medium, 3 long); NVML has no call for it. It is persisted with WithStateFile.
func (m *Machine) SetTimeslice(gpuIndex, level int) error {
	if level < 0 || level > 3 {
		return fmt.Errorf("set time-slice of GPU %d: level %d out of range 0-3", gpuIndex, level)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g, err := m.gpuAt(gpuIndex)
	if err != nil {
		return fmt.Errorf("set time-slice: %w", err)
	}
	old := g.timeslice
	g.timeslice = level
	if err := m.commitErr(func() { g.timeslice = old }); err != nil {
		return fmt.Errorf("set time-slice of GPU %d: %w", gpuIndex, err)
	}
	return nil
}

// Timeslice returns the time-slice level of GPU gpuIndex (0 for an unknown GPU).
func (m *Machine) Timeslice(gpuIndex int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, err := m.gpuAt(gpuIndex)
	if err != nil {
		return 0
	}
	return g.timeslice
}

// snapshot returns the persisted form of the machine. m.mu must be held.
func (m *Machine) snapshot() persistedState {
	s := persistedState{Version: stateVersion, Machine: m.spec.name, Seed: m.seed, Boots: m.boots}
	for _, g := range m.gpus {
		pg := persistedGPU{
			Index: g.index, UUID: g.uuid, MigMode: g.migCurrent, MigModePending: g.migPending,
			ComputeMode: int(g.computeMode), Timeslice: g.timeslice, Lost: g.lost,
			EccCorrected: g.eccCorrected, EccUncorrected: g.eccUncorrected, RecoveryAction: int(g.recoveryAction),
		}
		for _, gi := range g.sortedGpuInstances() {
			pg.GpuInstances = append(pg.GpuInstances, gi.state())
		}
		s.GPUs = append(s.GPUs, pg)
	}
	return s
}

// commitErr persists the state after a mutation; if that fails it runs undo and returns the
// error. m.mu must be held. Without a state file it only refreshes generated driver files.
func (m *Machine) commitErr(undo func()) error {
	if m.stateFile != "" {
		data, err := json.MarshalIndent(m.snapshot(), "", "  ")
		if err == nil {
			err = writeFileAtomic(m.stateFile, append(data, '\n'), 0o644)
		}
		if err != nil {
			undo()
			return fmt.Errorf("save simulated GPU state to %s: %w", m.stateFile, err)
		}
	}
	m.refreshDriverRoots()
	return nil
}

// commit is commitErr for NVML calls: a state that cannot be saved fails the call with
// ERROR_UNKNOWN, as a driver failure would.
func (m *Machine) commit(undo func()) nvml.Return {
	if err := m.commitErr(undo); err != nil {
		return nvml.ERROR_UNKNOWN
	}
	return nvml.SUCCESS
}

// loadOrCreateState loads m.stateFile into m, or creates it from the initial state.
func (m *Machine) loadOrCreateState() error {
	data, err := os.ReadFile(m.stateFile)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(m.stateFile), 0o755); err != nil {
			return fmt.Errorf("create directory for state file: %w", err)
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.commitErr(func() {})
	}
	if err != nil {
		return fmt.Errorf("read state file: %w", err)
	}
	var s persistedState
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("parse state file %s: %w", m.stateFile, err)
	}
	if err := m.apply(&s); err != nil {
		return fmt.Errorf("load state file %s: %w", m.stateFile, err)
	}
	return nil
}

// apply restores a persisted state into a freshly built machine, checking it against the rules
// live calls obey.
func (m *Machine) apply(s *persistedState) error {
	if s.Version != stateVersion {
		return fmt.Errorf("version %d, want %d", s.Version, stateVersion)
	}
	if s.Machine != m.spec.name || s.Seed != m.seed {
		return fmt.Errorf("it describes machine %q with seed %q, not %q with seed %q", s.Machine, s.Seed, m.spec.name, m.seed)
	}
	if len(s.GPUs) != len(m.gpus) {
		return fmt.Errorf("it has %d GPUs, machine %s has %d", len(s.GPUs), m.spec.name, len(m.gpus))
	}
	if s.Boots < 0 {
		return fmt.Errorf("invalid boots %d", s.Boots)
	}
	m.boots = s.Boots
	for i, pg := range s.GPUs {
		if pg.Index != i {
			return fmt.Errorf("GPU entry %d has index %d", i, pg.Index)
		}
		if err := m.gpus[i].apply(&pg); err != nil {
			return fmt.Errorf("GPU %d: %w", i, err)
		}
	}
	return nil
}

func (g *gpu) apply(pg *persistedGPU) error {
	if pg.ComputeMode < 0 || pg.ComputeMode >= int(nvml.COMPUTEMODE_COUNT) {
		return fmt.Errorf("invalid compute mode %d", pg.ComputeMode)
	}
	if pg.Timeslice < 0 || pg.Timeslice > 3 {
		return fmt.Errorf("invalid time-slice %d", pg.Timeslice)
	}
	g.computeMode, g.timeslice, g.lost = nvml.ComputeMode(pg.ComputeMode), pg.Timeslice, pg.Lost
	g.eccCorrected, g.eccUncorrected = pg.EccCorrected, pg.EccUncorrected
	if pg.RecoveryAction < 0 || pg.RecoveryAction > int(nvml.GPU_RECOVERY_ACTION_SYSTEM_REBOOT) {
		return fmt.Errorf("invalid recovery action %d", pg.RecoveryAction)
	}
	g.recoveryAction = nvml.DeviceGpuRecoveryAction(pg.RecoveryAction)
	for _, mode := range []int{pg.MigMode, pg.MigModePending} {
		if mode != nvml.DEVICE_MIG_DISABLE && (mode != nvml.DEVICE_MIG_ENABLE || g.spec.mig == nil) {
			return fmt.Errorf("invalid MIG mode %d", mode)
		}
	}
	g.migCurrent, g.migPending = pg.MigMode, pg.MigModePending
	if len(pg.GpuInstances) > 0 && !g.migEnabled() {
		return fmt.Errorf("%d GPU instances but MIG mode disabled", len(pg.GpuInstances))
	}
	for _, gs := range pg.GpuInstances {
		p := g.spec.mig.byID(gs.ProfileID)
		switch {
		case p == nil:
			return fmt.Errorf("GPU instance %d: unknown profile ID %d", gs.ID, gs.ProfileID)
		case gs.Size != p.size || !containsStart(p.starts, gs.Start):
			return fmt.Errorf("GPU instance %d: invalid placement %d:%d for profile %s", gs.ID, gs.Start, gs.Size, p.name)
		case gs.ID != giID(gs.Start, gs.Size):
			return fmt.Errorf("GPU instance %d: placement %d:%d has ID %d", gs.ID, gs.Start, gs.Size, giID(gs.Start, gs.Size))
		case !free(span{gs.Start, gs.Size}, g.giSpans()):
			return fmt.Errorf("GPU instance %d: placement %d:%d overlaps another instance", gs.ID, gs.Start, gs.Size)
		case g.giCount(p) >= p.instances:
			return fmt.Errorf("GPU instance %d: more than %d instances of profile %s", gs.ID, p.instances, p.name)
		}
		gi := g.addGI(gs.ID, p, gs.Start)
		for _, cs := range gs.ComputeInstances {
			if err := gi.applyCI(&cs); err != nil {
				return fmt.Errorf("GPU instance %d: compute instance %d: %w", gs.ID, cs.ID, err)
			}
		}
	}
	return nil
}

func (gi *gpuInstance) applyCI(cs *ComputeInstanceState) error {
	p := gi.gpu.spec.mig.ciProfile(gi.profile, int(cs.ProfileID))
	switch {
	case p == nil:
		return fmt.Errorf("unknown profile ID %d", cs.ProfileID)
	case cs.Size != p.slices || !containsStart(p.starts, cs.Start):
		return fmt.Errorf("invalid placement %d:%d for profile %s", cs.Start, cs.Size, p.name)
	case gi.computeInstances[cs.ID] != nil:
		return fmt.Errorf("duplicate ID")
	case !free(span{cs.Start, cs.Size}, gi.ciSpans()):
		return fmt.Errorf("placement %d:%d overlaps another compute instance", cs.Start, cs.Size)
	case gi.ciCount(p.index) >= p.instances:
		return fmt.Errorf("more than %d instances of profile %s", p.instances, p.name)
	}
	gi.addCI(cs.ID, p, cs.Start)
	return nil
}

// writeFileAtomic replaces path with data: temporary file in the same directory, write, fsync,
// rename, fsync the directory. Readers see the old or the new content, never a mix, and a crash
// at any point leaves one of them.
func writeFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err = f.Chmod(perm); err != nil {
		_ = f.Close()
		return err
	}
	if err = f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
