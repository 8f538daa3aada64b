package campaign

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
)

// claimState is what the kubelet knows about a claim: the campaign's model.
type claimState int

const (
	// prepared: the kubelet got success and did not unprepare since.
	prepared claimState = iota
	// pendingPrepare: a prepare failed or was cut off; the kubelet retries
	// it or gives up and unprepares. The plugin may hold the claim
	// completed, or not at all.
	pendingPrepare
	// pendingUnprepare: an unprepare failed or was cut off; the kubelet
	// retries it until it succeeds.
	pendingUnprepare
)

func (s claimState) String() string {
	return [...]string{"prepared", "pendingPrepare", "pendingUnprepare"}[s]
}

// Device kinds the campaign allocates.
const (
	kindGPU = "gpu"
	kindMIG = "mig"
	kindTS  = "timeslice"
	kindMPS = "mps"
	// kindVFIO: a GPU passed through to a virtual machine (vfio-pci).
	kindVFIO = "vfio"
)

var kinds = []string{kindGPU, kindMIG, kindTS, kindMPS, kindVFIO, kindChannel}

// claim is one allocated claim the campaign knows about.
type claim struct {
	obj   *resourceapi.ResourceClaim
	kind  string
	state claimState
	// ids are the CDI device IDs of the last successful prepare.
	ids []string
	// born is the op index that allocated it, for violation reports.
	born int
	// ended: its pod ended while the kubelet had lost its record of the
	// claim, so the kubelet lists no container with it and never
	// unprepares it (stale_test.go).
	ended bool
	// domain is a channel claim's ComputeDomain (channels_test.go).
	domain string
}

func (c *claim) uid() string { return string(c.obj.UID) }

// devices are the allocated device names, sorted.
func (c *claim) devices() []string {
	return sortedDevices(c.obj)
}

func sortedDevices(obj *resourceapi.ResourceClaim) []string {
	names := at.Devices(obj)
	slices.Sort(names)
	return names
}

var gpuOfDevice = regexp.MustCompile(`^gpu-(\d+)(-|$)`)

// gpus are the indexes of the physical GPUs the claim's devices are on.
func (c *claim) gpus() []int {
	var out []int
	for _, d := range c.devices() {
		m := gpuOfDevice.FindStringSubmatch(d)
		if m == nil {
			continue
		}
		i, _ := strconv.Atoi(m[1])
		if !slices.Contains(out, i) {
			out = append(out, i)
		}
	}
	return out
}

func (c *claim) touches(gpus map[int]bool) bool {
	for _, g := range c.gpus() {
		if gpus[g] {
			return true
		}
	}
	return false
}

var migProfiles = []string{"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}

// newClaim builds an unallocated claim of kind, avoiding the GPUs in
// avoid (lost ones: the scheduler sees them tainted).
func newClaim(rng *rand.Rand, name, kind string, avoid map[int]bool) *resourceapi.ResourceClaim {
	attr := "minor"
	if kind == kindMIG {
		attr = "parentMinor"
	}
	var sel []string
	for _, g := range slices.Sorted(maps.Keys(avoid)) {
		sel = append(sel, fmt.Sprintf(`device.attributes["gpu.dra.dev"].%s != %d`, attr, g))
	}
	switch kind {
	case kindGPU:
		return at.Claim(name, at.Exactly("gpu", driverName, int64(1+rng.IntN(2)), sel...))
	case kindMIG:
		profile := migProfiles[rng.IntN(len(migProfiles))]
		sel = append(sel, fmt.Sprintf(`device.attributes["gpu.dra.dev"].profile == %q`, profile))
		return at.Claim(name, at.Exactly("mig", "mig."+driverName, 1, sel...))
	case kindTS:
		c := at.Claim(name, at.Exactly("ts", "timeslice."+driverName, 1, sel...))
		if rng.IntN(2) == 0 {
			c.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driverName, Parameters: runtime.RawExtension{
					Raw: []byte(`{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`),
				}},
			}}}
		}
		return c
	case kindVFIO:
		return at.Claim(name, at.Exactly("vm", "vfio."+driverName, 1, sel...))
	default:
		r := at.Exactly("mps", "mps."+driverName, 1, sel...)
		r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"compute": resource.MustParse(strconv.Itoa(10 * (1 + rng.IntN(4)))), "memory": resource.MustParse("10Gi"),
		}}
		return at.Claim(name, r)
	}
}

// publishClaim makes the claim visible to the plugin's fake API server.
func publishClaim(root string, obj *resourceapi.ResourceClaim) error {
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	path := claimFile(root, obj.Namespace, obj.Name)
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func joinInts(xs []int) string {
	var s []string
	for _, x := range xs {
		s = append(s, strconv.Itoa(x))
	}
	return strings.Join(s, ",")
}
