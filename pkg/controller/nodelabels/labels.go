// Package nodelabels writes node labels compatible with NVIDIA GPU Feature
// Discovery (GFD), derived only from the driver's ResourceSlices, so
// workloads with nodeAffinity on e.g. nvidia.com/gpu.product keep working
// without GFD, NFD or NVML in the cluster.
package nodelabels

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Labels written as GFD writes them (names and value formats of
// NVIDIA/k8s-device-plugin's internal/lm), plus nvidia.com/gpu.present as
// the GPU Operator's NFD rule sets it.
const (
	LabelPresent         = "nvidia.com/gpu.present"
	LabelProduct         = "nvidia.com/gpu.product"
	LabelMemory          = "nvidia.com/gpu.memory"
	LabelCount           = "nvidia.com/gpu.count"
	LabelReplicas        = "nvidia.com/gpu.replicas"
	LabelSharingStrategy = "nvidia.com/gpu.sharing-strategy"
	LabelFamily          = "nvidia.com/gpu.family"
	LabelComputeMajor    = "nvidia.com/gpu.compute.major"
	LabelComputeMinor    = "nvidia.com/gpu.compute.minor"
	LabelMIGCapable      = "nvidia.com/mig.capable"
	LabelMPSCapable      = "nvidia.com/mps.capable"

	LabelDriverMajor    = "nvidia.com/cuda.driver-version.major"
	LabelDriverMinor    = "nvidia.com/cuda.driver-version.minor"
	LabelDriverRevision = "nvidia.com/cuda.driver-version.revision"
	LabelDriverFull     = "nvidia.com/cuda.driver-version.full"
	LabelRuntimeMajor   = "nvidia.com/cuda.runtime-version.major"
	LabelRuntimeMinor   = "nvidia.com/cuda.runtime-version.minor"
	LabelRuntimeFull    = "nvidia.com/cuda.runtime-version.full"

	// GFD still writes these deprecated names next to the new ones.
	LabelDeprecatedDriverMajor  = "nvidia.com/cuda.driver.major"
	LabelDeprecatedDriverMinor  = "nvidia.com/cuda.driver.minor"
	LabelDeprecatedDriverRev    = "nvidia.com/cuda.driver.rev"
	LabelDeprecatedRuntimeMajor = "nvidia.com/cuda.runtime.major"
	LabelDeprecatedRuntimeMinor = "nvidia.com/cuda.runtime.minor"
)

// Sharing strategies, as GFD names them.
const (
	SharingNone        = "none"
	SharingTimeSlicing = "time-slicing"
	SharingMPS         = "mps"
)

// DriverLabel is the label naming the driver on a node with its GPUs:
// <driver>/driver=true.
func DriverLabel(driverName string) string { return driverName + "/driver" }

// OptOutKey is the label or annotation that, set to OptOutValue on a node,
// keeps the controller off it (it removes what it wrote): for example
// gpu.dra.dev/node-labels=disabled.
func OptOutKey(driverName string) string { return driverName + "/node-labels" }

// OptOutValue disables labelling in OptOutKey.
const OptOutValue = "disabled"

// OwnedAnnotation records, comma-separated, the labels the controller
// wrote on a node; it only ever removes those.
func OwnedAnnotation(driverName string) string { return driverName + "/owned-labels" }

// gpu is what the labels need of one physical GPU, gathered from every
// device carved from it (whole GPU, shares, MIG devices).
type gpu struct {
	uuid          string
	product       string
	architecture  string
	compute       string // "9.0.0"
	driverVersion *resourceapi.DeviceAttribute
	cudaVersion   string // "12.4.0"
	memoryBytes   int64  // 0 when no device says
	migCapable    bool
	cliqueID      string                    // "" without a completed NVLink fabric
	shares        map[vocabulary.Kind]int64 // device kind → shares published
}

// Labels computes the labels for a node from its ResourceSlices of
// driverName. Only the newest generation of each pool counts. A node
// without GPUs gets no labels.
//
// On a node with more than one GPU model, GFD labels one model: it logs a
// warning and, per product, writes gpu.product, gpu.count, gpu.memory and
// the compute labels over one another in map order, so one model's set
// wins. Here the model with the most GPUs wins, ties going to the smaller
// product name, so the result is deterministic. Versions, mig.capable and
// mps.capable describe the whole node, as in GFD.
func Labels(driverName string, slices []*resourceapi.ResourceSlice) map[string]string {
	gpus := collect(driverName, newest(driverName, slices))
	if len(gpus) == 0 {
		return map[string]string{}
	}
	model := chooseModel(gpus)
	first := model[0]

	labels := map[string]string{
		LabelPresent:            "true",
		DriverLabel(driverName): "true",
		LabelCount:              strconv.Itoa(len(model)),
		LabelMIGCapable:         "false",
		LabelMPSCapable:         "false",
	}
	if p := ProductLabelValue(first.product); p != "" {
		labels[LabelProduct] = p
	}
	if mem := minMemory(model); mem > 0 {
		labels[LabelMemory] = strconv.FormatInt(mem>>20, 10) // MiB, as NVML's total / 2^20
	}
	if major, minor, ok := majorMinor(first.compute); ok && major != "0" {
		labels[LabelComputeMajor] = major
		labels[LabelComputeMinor] = minor
		labels[LabelFamily] = family(major, minor, first.architecture)
	}
	strategy, replicas := sharing(model)
	labels[LabelSharingStrategy] = strategy
	labels[LabelReplicas] = strconv.FormatInt(replicas, 10)
	for _, g := range gpus {
		if g.migCapable {
			labels[LabelMIGCapable] = "true"
		}
		if g.shares[vocabulary.KindMPS] > 0 {
			labels[LabelMPSCapable] = "true"
		}
	}
	if major, minor, rev, ok := driverVersion(first.driverVersion); ok {
		labels[LabelDriverMajor], labels[LabelDeprecatedDriverMajor] = major, major
		labels[LabelDriverMinor], labels[LabelDeprecatedDriverMinor] = minor, minor
		labels[LabelDriverRevision], labels[LabelDeprecatedDriverRev] = rev, rev
		full := major + "." + minor
		if rev != "" {
			full += "." + rev
		}
		labels[LabelDriverFull] = full
	}
	if major, minor, ok := majorMinor(first.cudaVersion); ok {
		labels[LabelRuntimeMajor], labels[LabelDeprecatedRuntimeMajor] = major, major
		labels[LabelRuntimeMinor], labels[LabelDeprecatedRuntimeMinor] = minor, minor
		labels[LabelRuntimeFull] = major + "." + minor
	}
	if clique := nodeClique(gpus); clique != "" {
		labels[vocabulary.LabelClique] = clique
	}
	// A value that is no valid label value (cannot happen with the formats
	// above, but the inputs come from the API) is left out rather than
	// failing the whole patch.
	for k, v := range labels {
		if len(validation.IsValidLabelValue(v)) > 0 {
			delete(labels, k)
		}
	}
	return labels
}

// nodeClique is the NVLink clique of a node: the cliqueID its GPUs with one
// agree on; "" when none has one or they disagree (a node whose GPUs are in
// two cliques belongs to neither clique's channel pool).
func nodeClique(gpus []*gpu) string {
	ids := make([]string, len(gpus))
	for i, g := range gpus {
		ids[i] = g.cliqueID
	}
	clique, _ := vocabulary.CommonClique(ids...)
	return clique
}

// newest keeps the node-local slices of driverName in the newest generation
// of their pool; older generations are being replaced.
func newest(driverName string, in []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	gen := map[string]int64{}
	for _, s := range in {
		if s.Spec.Driver == driverName {
			gen[s.Spec.Pool.Name] = max(gen[s.Spec.Pool.Name], s.Spec.Pool.Generation)
		}
	}
	var out []*resourceapi.ResourceSlice
	for _, s := range in {
		if s.Spec.Driver == driverName && s.Spec.Pool.Generation == gen[s.Spec.Pool.Name] {
			out = append(out, s)
		}
	}
	return out
}

// collect gathers the physical GPUs behind the slices' devices, keyed by
// GPU UUID (a MIG device names its parent's), sorted by UUID.
func collect(driverName string, in []*resourceapi.ResourceSlice) []*gpu {
	byUUID := map[string]*gpu{}
	for _, s := range in {
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			attr := func(name resourceapi.QualifiedName) *resourceapi.DeviceAttribute {
				if a, ok := d.Attributes[name]; ok {
					return &a
				}
				if a, ok := d.Attributes[resourceapi.QualifiedName(driverName+"/"+string(name))]; ok {
					return &a
				}
				return nil
			}
			typ := vocabulary.Kind(str(attr(vocabulary.AttrType)))
			uuid := str(attr(vocabulary.AttrUUID))
			if typ == vocabulary.KindMIG {
				uuid = str(attr(vocabulary.AttrParentUUID))
			}
			if uuid == "" || !typ.Known() {
				continue
			}
			g := byUUID[uuid]
			if g == nil {
				g = &gpu{uuid: uuid, shares: map[vocabulary.Kind]int64{}}
				byUUID[uuid] = g
			}
			if g.product == "" {
				g.product = str(attr(vocabulary.AttrProductName))
				g.architecture = str(attr(vocabulary.AttrArchitecture))
				g.compute = str(attr(vocabulary.AttrCUDAComputeCapability))
				g.driverVersion = attr(vocabulary.AttrDriverVersion)
				g.cudaVersion = str(attr(vocabulary.AttrCUDADriverVersion))
			}
			if g.cliqueID == "" {
				g.cliqueID = str(attr(vocabulary.AttrCliqueID))
			}
			switch typ {
			case vocabulary.KindGPU:
				if a := attr(vocabulary.AttrMIGCapable); a != nil && a.BoolValue != nil && *a.BoolValue {
					g.migCapable = true
				}
				if c, ok := d.Capacity[vocabulary.CapacityMemory]; ok {
					g.memoryBytes = c.Value.Value()
				}
			case vocabulary.KindMIG:
				g.migCapable = true
			case vocabulary.KindTimeSlice, vocabulary.KindMPS:
				if c, ok := d.Capacity[vocabulary.CapacityShares]; ok {
					g.shares[typ] = c.Value.Value()
				}
				if c, ok := d.Capacity[vocabulary.CapacityMemory]; ok && g.memoryBytes == 0 {
					g.memoryBytes = c.Value.Value()
				}
			}
		}
	}
	out := make([]*gpu, 0, len(byUUID))
	for _, g := range byUUID {
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b *gpu) int { return cmp.Compare(a.uuid, b.uuid) })
	return out
}

// str is a string or version attribute's value, "" when absent.
func str(a *resourceapi.DeviceAttribute) string {
	switch {
	case a == nil:
		return ""
	case a.StringValue != nil:
		return *a.StringValue
	case a.VersionValue != nil:
		return *a.VersionValue
	case a.IntValue != nil:
		return strconv.FormatInt(*a.IntValue, 10)
	}
	return ""
}

// chooseModel returns the GPUs of the model the per-model labels describe:
// the most numerous, ties to the smaller product name.
func chooseModel(gpus []*gpu) []*gpu {
	byProduct := map[string][]*gpu{}
	for _, g := range gpus {
		byProduct[g.product] = append(byProduct[g.product], g)
	}
	products := make([]string, 0, len(byProduct))
	for p := range byProduct {
		products = append(products, p)
	}
	slices.SortFunc(products, func(a, b string) int {
		if c := cmp.Compare(len(byProduct[b]), len(byProduct[a])); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	return byProduct[products[0]]
}

func minMemory(gpus []*gpu) int64 {
	var m int64
	for _, g := range gpus {
		if g.memoryBytes > 0 && (m == 0 || g.memoryBytes < m) {
			m = g.memoryBytes
		}
	}
	return m
}

// sharing is GFD's sharing strategy and replicas: MPS wins over
// time-slicing (as in GFD's config), a strategy needs more than one share
// per GPU, and replicas are the fewest shares a GPU of the model offers
// under it (1 without sharing).
func sharing(model []*gpu) (string, int64) {
	for _, s := range []struct {
		typ      vocabulary.Kind
		strategy string
	}{
		{vocabulary.KindMPS, SharingMPS}, {vocabulary.KindTimeSlice, SharingTimeSlicing},
	} {
		var replicas int64
		for _, g := range model {
			if n := g.shares[s.typ]; n > 1 && (replicas == 0 || n < replicas) {
				replicas = n
			}
		}
		if replicas > 1 {
			return s.strategy, replicas
		}
	}
	return SharingNone, 1
}

var notInProduct = regexp.MustCompile(`[^A-Za-z0-9\-_. ]`)

// ProductLabelValue is GFD's nvidia.com/gpu.product value for an NVML
// product name: characters other than letters, digits, '-', '_', '.' and
// space dropped, runs of spaces turned into one '-'
// ("NVIDIA H100 80GB HBM3" → "NVIDIA-H100-80GB-HBM3"). It is cut to a label
// value's 63 characters where needed.
func ProductLabelValue(product string) string {
	v := strings.Join(strings.Fields(notInProduct.ReplaceAllString(product, "")), "-")
	if len(v) > validation.LabelValueMaxLength {
		v = v[:validation.LabelValueMaxLength]
	}
	return strings.TrimRight(v, "-_.")
}

// majorMinor splits "9.0.0" or "12.4" into its first two parts.
func majorMinor(v string) (string, string, bool) {
	parts := strings.Split(v, ".")
	if len(parts) < 2 || parts[0] == "" || parts[1] == "" {
		return "", "", false
	}
	return parts[0], parts[1], true
}

// driverVersion splits the driver version as GFD does (X.Y[.Z]). The
// device model publishes it as a semantic version, which drops the leading
// zero of NVIDIA's two-digit revisions ("535.104.05" → "535.104.5"); the
// revision is padded back to two digits. A string attribute (a version
// semver could not hold) is split as is.
func driverVersion(a *resourceapi.DeviceAttribute) (major, minor, rev string, ok bool) {
	if a == nil {
		return "", "", "", false
	}
	if a.VersionValue != nil {
		parts := strings.SplitN(*a.VersionValue, ".", 3)
		if len(parts) != 3 {
			return "", "", "", false
		}
		p, err := strconv.Atoi(strings.SplitN(parts[2], "-", 2)[0])
		if err != nil {
			return "", "", "", false
		}
		return parts[0], parts[1], fmt.Sprintf("%02d", p), true
	}
	if a.StringValue != nil {
		parts := strings.Split(*a.StringValue, ".")
		if len(parts) < 2 || len(parts) > 3 {
			return "", "", "", false
		}
		if len(parts) == 3 {
			rev = parts[2]
		}
		return parts[0], parts[1], rev, true
	}
	return "", "", "", false
}

// family is GFD's architecture family for a compute capability. For a
// capability GFD does not know yet it is the published architecture in
// GFD's style (lower case, '-' for spaces) rather than GFD's "undefined".
func family(major, minor, architecture string) string {
	mi, _ := strconv.Atoi(minor)
	switch major {
	case "1":
		return "tesla"
	case "2":
		return "fermi"
	case "3":
		return "kepler"
	case "5":
		return "maxwell"
	case "6":
		return "pascal"
	case "7":
		if mi < 5 {
			return "volta"
		}
		return "turing"
	case "8":
		if mi < 9 {
			return "ampere"
		}
		return "ada-lovelace"
	case "9":
		return "hopper"
	case "10", "12":
		return "blackwell"
	}
	if a := strings.ToLower(ProductLabelValue(architecture)); a != "" {
		return a
	}
	return "undefined"
}
