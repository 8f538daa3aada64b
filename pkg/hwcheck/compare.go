package hwcheck

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
)

// Difference is one place where a real GPU and the simulated GPU of the
// same model differ.
type Difference struct {
	// GPU is the real GPU's device name.
	GPU string `json:"gpu"`
	// What names the fact: "model productName", "device gpu attribute
	// gpu.dra.dev/numaNode", "mig profile 1g.18gb placements", …
	What string `json:"what"`
	// Simulated and Real are the values; "(absent)" when one side lacks it.
	Simulated string `json:"simulated"`
	Real      string `json:"real"`
}

func (d Difference) String() string {
	return fmt.Sprintf("%s: %s: simulated %s, real %s", d.GPU, d.What, d.Simulated, d.Real)
}

const absent = "(absent)"

// Compare lists every structural difference between a real GPU's shape
// and the simulated one's, sorted by what differs.
func Compare(real, sim Shape) []Difference {
	var out []Difference
	add := func(what, s, r string) {
		if s != r {
			out = append(out, Difference{GPU: real.GPU, What: what, Simulated: s, Real: r})
		}
	}
	compareMaps("model", sim.Model, real.Model, add)
	compareMaps("counter", sim.Counters, real.Counters, add)
	for _, name := range unionKeys(sim.Devices, real.Devices) {
		s, sok := sim.Devices[name]
		r, rok := real.Devices[name]
		if !sok || !rok {
			add("device "+name, presence(sok), presence(rok))
			continue
		}
		compareMaps("device "+name+" attribute", s.Attributes, r.Attributes, add)
		compareMaps("device "+name+" capacity", s.Capacity, r.Capacity, add)
		compareMaps("device "+name+" consumes", s.Consumes, r.Consumes, add)
	}
	compareMIG(sim, real, add)
	slices.SortFunc(out, func(a, b Difference) int { return strings.Compare(a.What, b.What) })
	return out
}

func compareMIG(sim, real Shape, add func(what, s, r string)) {
	add("mig support", strconv.FormatBool(sim.MIG != nil), strconv.FormatBool(real.MIG != nil))
	if sim.MIGTotals != nil && real.MIGTotals != nil {
		compareMaps("mig totals", totalsFields(*sim.MIGTotals), totalsFields(*real.MIGTotals), add)
	}
	sp, rp := profilesByName(sim.MIG), profilesByName(real.MIG)
	for _, name := range unionKeys(sp, rp) {
		s, sok := sp[name]
		r, rok := rp[name]
		if !sok || !rok {
			add("mig profile "+name, presence(sok), presence(rok))
			continue
		}
		compareMaps("mig profile "+name, profileFields(s), profileFields(r), add)
	}
	add("mig profile order", profileOrder(sim.MIG), profileOrder(real.MIG))
}

func compareMaps(what string, sim, real map[string]string, add func(what, s, r string)) {
	for _, k := range unionKeys(sim, real) {
		s, sok := sim[k]
		r, rok := real[k]
		if !sok {
			s = absent
		}
		if !rok {
			r = absent
		}
		add(what+" "+k, s, r)
	}
}

func unionKeys[V any](a, b map[string]V) []string {
	keys := slices.Collect(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func presence(ok bool) string {
	if ok {
		return "present"
	}
	return absent
}

func profilesByName(ps []mig.Profile) map[string]mig.Profile {
	out := make(map[string]mig.Profile, len(ps))
	for _, p := range ps {
		out[p.Name] = p
	}
	return out
}

func profileOrder(ps []mig.Profile) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return strings.Join(names, ",")
}

func profileFields(p mig.Profile) map[string]string {
	pls := make([]string, len(p.Placements))
	for i, pl := range p.Placements {
		pls[i] = pl.String()
	}
	return map[string]string{
		"index": strconv.Itoa(p.Index), "id": strconv.FormatUint(uint64(p.ID), 10),
		"computeSlices": strconv.Itoa(p.ComputeSlices), "memorySlices": strconv.Itoa(p.MemorySlices),
		"memoryBytes": strconv.FormatUint(p.MemoryBytes, 10), "multiprocessors": strconv.Itoa(p.Multiprocessors),
		"copyEngines": strconv.Itoa(p.CopyEngines), "decoders": strconv.Itoa(p.Decoders),
		"encoders": strconv.Itoa(p.Encoders), "jpegs": strconv.Itoa(p.JPEGs), "ofas": strconv.Itoa(p.OFAs),
		"maxInstances": strconv.Itoa(p.MaxInstances), "placements": strings.Join(pls, " "),
	}
}

func totalsFields(t mig.Totals) map[string]string {
	return map[string]string{
		"memorySlices": strconv.Itoa(t.MemorySlices), "computeSlices": strconv.Itoa(t.ComputeSlices),
		"memoryBytes": strconv.FormatUint(t.MemoryBytes, 10), "multiprocessors": strconv.Itoa(t.Multiprocessors),
		"copyEngines": strconv.Itoa(t.CopyEngines), "decoders": strconv.Itoa(t.Decoders),
		"encoders": strconv.Itoa(t.Encoders), "jpegs": strconv.Itoa(t.JPEGs), "ofas": strconv.Itoa(t.OFAs),
	}
}

// CheckCounters checks that a GPU's counters add up, on its own: the whole
// GPU and its shares exclude every other device of the GPU; no device consumes a counter the
// set lacks, or more of one than it holds; and for each MIG profile, the
// counters let exactly as many instances coexist as NVML's MaxInstances
// says. It returns one problem per broken rule.
func CheckCounters(s Shape) []string {
	var problems []string
	capacity := map[string]int64{}
	for name, v := range s.Counters {
		capacity[name] = quantity(v)
	}
	for _, name := range slices.Sorted(maps.Keys(s.Devices)) {
		d := s.Devices[name]
		for _, c := range slices.Sorted(maps.Keys(d.Consumes)) {
			v := d.Consumes[c]
			have, ok := capacity[c]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("%s: device %s consumes counter %s, which the counter set lacks", s.GPU, name, c))
			case quantity(v) > have:
				problems = append(problems, fmt.Sprintf("%s: device %s consumes %s %s, more than the %d there are", s.GPU, name, v, c, have))
			}
		}
	}
	problems = append(problems, wholeNotExclusive(s, capacity)...)
	for _, p := range s.MIG {
		if !slices.ContainsFunc(slices.Collect(maps.Values(s.Devices)), func(d DeviceShape) bool { return d.Profile == p.Name }) {
			continue // not published (policy, MIG off)
		}
		if n := coexisting(s, p.Name, capacity); n != p.MaxInstances {
			problems = append(problems, fmt.Sprintf("%s: MIG profile %s: the counters let %d instances coexist, NVML says at most %d", s.GPU, p.Name, n, p.MaxInstances))
		}
	}
	return problems
}

// wholeNotExclusive names each pair of devices that the counters let be
// allocated together although one of them takes the whole GPU (the whole
// GPU, a share device: no MIG profile). Such a device need not consume
// every counter (docs/device-model.md, lean counters), but for each other
// device that consumes counters, one counter must not hold both.
func wholeNotExclusive(s Shape, capacity map[string]int64) []string {
	var problems []string
	names := slices.Sorted(maps.Keys(s.Devices))
	for _, name := range names {
		whole := s.Devices[name]
		if whole.Profile != "" || len(whole.Consumes) == 0 {
			continue
		}
		for _, other := range names {
			d := s.Devices[other]
			if other == name || len(d.Consumes) == 0 {
				continue
			}
			if !slices.ContainsFunc(slices.Collect(maps.Keys(d.Consumes)), func(c string) bool {
				v, ok := whole.Consumes[c]
				return ok && quantity(v)+quantity(d.Consumes[c]) > capacity[c]
			}) {
				problems = append(problems, fmt.Sprintf("%s: %s takes the whole GPU, but its counters fit beside device %s", s.GPU, name, other))
			}
		}
	}
	return problems
}

// coexisting is how many of the published MIG devices of a profile the
// counters let be allocated at once. Packing them by placement start is
// optimal: all placements of a profile have the same size and consumption.
func coexisting(s Shape, profile string, capacity map[string]int64) int {
	var devices []DeviceShape
	for _, d := range s.Devices {
		if d.Profile == profile {
			devices = append(devices, d)
		}
	}
	slices.SortFunc(devices, func(a, b DeviceShape) int { return int(a.PlacementStart) - int(b.PlacementStart) })
	used := map[string]int64{}
	n := 0
	for _, d := range devices {
		fits := true
		for c, v := range d.Consumes {
			fits = fits && used[c]+quantity(v) <= capacity[c]
		}
		if !fits {
			continue
		}
		for c, v := range d.Consumes {
			used[c] += quantity(v)
		}
		n++
	}
	return n
}

func quantity(v string) int64 {
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return -1
	}
	return q.Value()
}
