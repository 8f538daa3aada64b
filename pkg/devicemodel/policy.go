package devicemodel

import (
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"

	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
)

// MIGMode says how the node's MIG-capable GPUs are published.
type MIGMode string

const (
	// MIGDynamic publishes every profile × placement as a partitionable
	// device; instances are created at prepare and destroyed at unprepare.
	MIGDynamic MIGMode = "dynamic"
	// MIGOff publishes no MIG devices (GPUs with instances created out of
	// band still publish those, as static MIG devices).
	MIGOff MIGMode = "off"
)

// GPUPolicy is what the admin allows on one GPU.
type GPUPolicy struct {
	// WholeGPU publishes the GPU for exclusive use.
	WholeGPU *bool `json:"wholeGPU,omitempty"`
	// MIG publishes MIG devices ("dynamic") or not ("off").
	MIG MIGMode `json:"mig,omitempty"`
	// MIGProfiles, when set, limits dynamic MIG devices to these profiles
	// (nvidia-smi names such as "1g.10gb", "3g.40gb", "1g.10gb+me"). Every
	// placement of a profile costs the scheduler's allocator a device to
	// check per claim; a node that only ever hands out two or three
	// profiles is scheduled several times faster without the others.
	// Profiles a GPU does not have are skipped.
	MIGProfiles []string `json:"migProfiles,omitempty"`
	// TimeSlicing and MPS publish a shareable device per strategy.
	TimeSlicing *SharePolicy `json:"timeSlicing,omitempty"`
	MPS         *SharePolicy `json:"mps,omitempty"`
	// Passthrough publishes the GPU for a virtual machine too: a device
	// of type vfio that, when prepared, takes the GPU from the host's
	// nvidia driver and binds it to vfio-pci. Off unless set: a guest
	// gets the whole PCI function, firmware included (docs/security.md).
	Passthrough *bool `json:"passthrough,omitempty"`
}

// SharePolicy configures the shares of one strategy.
type SharePolicy struct {
	Enabled *bool `json:"enabled,omitempty"`
	// MaxShares is how many claims may share the GPU at once (the device
	// plugin's "replicas"); each share gets 1/MaxShares of compute and
	// memory unless it asks for more or less.
	MaxShares int `json:"maxShares,omitempty"`
}

// Policy is the node's publication policy: defaults plus per-GPU overrides
// keyed by minor number or UUID.
type Policy struct {
	Default GPUPolicy            `json:"default"`
	GPUs    map[string]GPUPolicy `json:"gpus,omitempty"`
	// Reserve, with SpareGPUs above 0, publishes MIG placements and shares
	// only on GPUs already partitioned or shared plus a few spare GPUs
	// (reserve.go, docs/device-model.md "Reserve policy").
	Reserve ReservePolicy `json:"reserve,omitempty"`
}

// DefaultMaxShares is the share count when the policy gives none.
const DefaultMaxShares = 4

// DefaultPolicy publishes everything a GPU supports.
func DefaultPolicy() Policy {
	return Policy{}
}

// LoadPolicy reads a policy file (YAML or JSON); empty path means defaults.
func LoadPolicy(path string) (Policy, error) {
	if path == "" {
		return DefaultPolicy(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Policy{}, fmt.Errorf("read device policy: %w", err)
	}
	var p Policy
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		return Policy{}, fmt.Errorf("parse device policy %s: %w", path, err)
	}
	if err := p.Validate(); err != nil {
		return Policy{}, fmt.Errorf("device policy %s: %w", path, err)
	}
	return p, nil
}

// Validate checks values a typo could get wrong.
func (p Policy) Validate() error {
	check := func(where string, g GPUPolicy) error {
		switch g.MIG {
		case "", MIGDynamic, MIGOff:
		default:
			return fmt.Errorf("%s.mig: %q is not one of %q, %q", where, g.MIG, MIGDynamic, MIGOff)
		}
		for i, name := range g.MIGProfiles {
			if !migProfileName.MatchString(name) {
				return fmt.Errorf("%s.migProfiles[%d]: %q is not a MIG profile name like 1g.10gb, 3g.40gb or 1g.10gb+me", where, i, name)
			}
			if slices.Contains(g.MIGProfiles[:i], name) {
				return fmt.Errorf("%s.migProfiles[%d]: %q is listed twice", where, i, name)
			}
		}
		for _, f := range []struct {
			name string
			s    *SharePolicy
		}{{"timeSlicing", g.TimeSlicing}, {"mps", g.MPS}} {
			if f.s != nil && (f.s.MaxShares < 0 || f.s.MaxShares > 64) {
				return fmt.Errorf("%s.%s.maxShares: %d is not in 1..64", where, f.name, f.s.MaxShares)
			}
		}
		return nil
	}
	if err := p.Reserve.validate(); err != nil {
		return err
	}
	if err := check("default", p.Default); err != nil {
		return err
	}
	// In key order: of several mistakes, the same one is named every time.
	for _, key := range slices.Sorted(maps.Keys(p.GPUs)) {
		if err := check("gpus["+key+"]", p.GPUs[key]); err != nil {
			return err
		}
	}
	return nil
}

// migProfileName is nvidia-smi's MIG profile naming: <compute slices>g.<GB>gb,
// optionally with a media-engine or graphics suffix (pkg/mig).
var migProfileName = regexp.MustCompile(`^[1-9]g\.[0-9]+gb(\+me|\+me\.all|-me|\+gfx)?$`)

// resolved is the effective policy of one GPU.
type resolved struct {
	wholeGPU    bool
	mig         MIGMode
	migProfiles []string // nil: all
	timeSlicing int      // max shares; 0 = not published
	mps         int
	passthrough bool
}

// forGPU merges the defaults with the GPU's override.
func (p Policy) forGPU(g *discovery.GPU) resolved {
	r := resolved{wholeGPU: true, mig: MIGDynamic, timeSlicing: DefaultMaxShares, mps: DefaultMaxShares}
	apply := func(o GPUPolicy) {
		if o.WholeGPU != nil {
			r.wholeGPU = *o.WholeGPU
		}
		if o.MIG != "" {
			r.mig = o.MIG
		}
		if o.MIGProfiles != nil {
			r.migProfiles = o.MIGProfiles
		}
		if o.Passthrough != nil {
			r.passthrough = *o.Passthrough
		}
		r.timeSlicing = applyShare(r.timeSlicing, o.TimeSlicing)
		r.mps = applyShare(r.mps, o.MPS)
	}
	apply(p.Default)
	for _, key := range []string{strconv.Itoa(g.Minor), g.UUID} {
		if o, ok := p.GPUs[key]; ok {
			apply(o)
		}
	}
	return r
}

func applyShare(current int, s *SharePolicy) int {
	if s == nil {
		return current
	}
	if s.Enabled != nil && !*s.Enabled {
		return 0
	}
	if s.MaxShares > 0 {
		return s.MaxShares
	}
	if current == 0 {
		return DefaultMaxShares
	}
	return current
}
