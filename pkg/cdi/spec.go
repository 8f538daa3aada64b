// Package cdi writes one transient CDI spec per prepared ResourceClaim, for
// CDI-aware container runtimes (containerd 2.x, CRI-O, podman), and finds the
// NVIDIA driver files those specs inject. See docs/cdi.md.
package cdi

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"

	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"k8s.io/apimachinery/pkg/types"
)

const (
	// Vendor is the CDI vendor of this driver's devices.
	Vendor = "k8s.gpu.dra.dev"
	// Class is the CDI device class of this driver's devices.
	Class = "gpu"
	// Kind is the CDI kind of this driver's specs.
	Kind = Vendor + "/" + Class
	// DefaultSpecDir is the CDI directory for transient specs, which do not
	// survive a reboot (neither do prepared claims).
	DefaultSpecDir = "/var/run/cdi"
)

// Annotation keys in the specs. Spec-level keys identify the claim; device
// keys record the allocation result, so that prepared claims can be rebuilt
// from the specs when the checkpoint is lost.
const (
	AnnotationClaimUID       = "gpu.dra.dev/claim-uid"
	AnnotationClaimNamespace = "gpu.dra.dev/claim-namespace"
	AnnotationClaimName      = "gpu.dra.dev/claim-name"

	AnnotationRequest = "gpu.dra.dev/request"
	AnnotationPool    = "gpu.dra.dev/pool"
	AnnotationDevice  = "gpu.dra.dev/device"
	AnnotationShareID = "gpu.dra.dev/share-id"
	AnnotationKind    = "gpu.dra.dev/kind"
	// AnnotationUUIDs holds the device's UUIDs, comma-separated.
	AnnotationUUIDs = "gpu.dra.dev/uuids"
)

// Environment variables set for every container that gets a device of a claim.
const (
	// EnvVisibleDevices lists the UUIDs of the claim's devices.
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
)

// ClaimInfo identifies a ResourceClaim.
type ClaimInfo struct {
	UID       types.UID
	Namespace string
	Name      string
}

// ClaimDevice is one device of a claim, as the container should see it.
type ClaimDevice struct {
	// Name identifies the device within the claim and must be unique in it;
	// the CDI device is named "<claim UID>-<Name>". Usually the DRA device
	// name; a device allocated more than once (consumable capacity) adds its
	// share ID.
	Name string
	// DeviceRecord is recorded in the spec's annotations.
	DeviceRecord
	// DeviceNodes are the device's own nodes, as paths below the driver root,
	// which are also their paths in the container: /dev/nvidia3, MIG
	// capability nodes under /dev/nvidia-caps.
	DeviceNodes []string
	// CharDevices are nodes given by their numbers, with no file on the
	// host: the runtime makes them in the container (IMEX channels, whose
	// nodes the driver makes only on request).
	CharDevices []CharDevice
	// Env are extra "NAME=value" variables for this device, for example for
	// MPS. Variables of different devices must not conflict.
	Env []string
	// Mounts are extra mounts for this device.
	Mounts []Mount
	// Annotations are extra annotations for this device. The keys set by
	// this package take precedence.
	Annotations map[string]string
}

// CharDevice is a character device node in a container, by its numbers;
// every user of the container may open it (mode 0666, the nvidia driver's
// default for its nodes).
type CharDevice struct {
	// Path is the absolute path in the container.
	Path string
	// Major and Minor are the device's numbers.
	Major, Minor uint32
}

// charDeviceMode is a CharDevice's mode.
const charDeviceMode fs.FileMode = 0o666

// DeviceRecord is what a claim spec records of each device in its
// annotations, so that a lost checkpoint can be rebuilt from the specs
// (ClaimSpecDevice).
type DeviceRecord struct {
	// Request, Pool, Device and ShareID are the allocation result; Kind is
	// the checkpoint's device kind.
	Request string
	Pool    string
	Device  string
	ShareID string
	Kind    vocabulary.Kind
	// UUIDs are the NVIDIA UUIDs of what the container gets (GPU-… or MIG-…).
	UUIDs []string
}

// Mount is a bind mount of a host path into a container: a CDI device's
// (ClaimDevice.Mounts), a share's container edits (pkg/sharing, recorded in
// its state as JSON) and an MPS daemon pod's (pkg/mpspod) alike.
type Mount struct {
	// HostPath is an absolute path on the host (not below the driver root),
	// which the plugin sees at the same path; it must exist when a spec
	// naming it is written.
	HostPath string `json:"hostPath"`
	// ContainerPath is the absolute path in the container.
	ContainerPath string `json:"containerPath"`
	// ReadOnly makes the mount read-only.
	ReadOnly bool `json:"readOnly,omitempty"`
}

// Mount options. nosuid and nodev apply to every mount: nothing injected
// needs set-uid or device files through a bind mount.
var (
	readOnlyMountOptions  = []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}
	readWriteMountOptions = []string{"nosuid", "nodev", "rbind", "rprivate"}
)

// specBuilder turns a claim and its devices into a CDI spec.
type specBuilder struct {
	// driverRoot is where this process reads the driver's files,
	// hostDriverRoot where the container runtime finds them.
	driverRoot       root
	hostDriverRoot   root
	files            *DriverFiles
	containerLibDirs []string
	// dirs are directories below the driver root mounted read-only at the
	// same path in every container (WithDriverRootDirs).
	dirs []string
}

// build returns the spec for the claim and the CDI device IDs, one per device
// in the order given.
func (b *specBuilder) build(claim ClaimInfo, devices []ClaimDevice) (*cdispec.Spec, []string, error) {
	if err := validateClaimUID(claim.UID); err != nil {
		return nil, nil, err
	}
	if len(devices) == 0 {
		return nil, nil, fmt.Errorf("claim %s has no devices", claim.UID)
	}

	spec := &cdispec.Spec{
		Kind: Kind,
		Annotations: map[string]string{
			AnnotationClaimUID:       string(claim.UID),
			AnnotationClaimNamespace: claim.Namespace,
			AnnotationClaimName:      claim.Name,
		},
	}
	ids := make([]string, 0, len(devices))
	seen := map[string]bool{}
	var uuids []string
	for _, d := range devices {
		if d.Name == "" {
			return nil, nil, fmt.Errorf("claim %s: device with empty name", claim.UID)
		}
		if seen[d.Name] {
			return nil, nil, fmt.Errorf("claim %s: device name %q is not unique", claim.UID, d.Name)
		}
		seen[d.Name] = true
		cdiDev, err := b.device(claim.UID, d)
		if err != nil {
			return nil, nil, fmt.Errorf("claim %s: device %s: %w", claim.UID, d.Name, err)
		}
		spec.Devices = append(spec.Devices, cdiDev)
		ids = append(ids, cdiparser.QualifiedName(Vendor, Class, cdiDev.Name))
		for _, u := range d.UUIDs {
			if !slices.Contains(uuids, u) {
				uuids = append(uuids, u)
			}
		}
	}

	// A claim of passthrough devices only is for a VM launcher: the GPU is
	// on vfio-pci, so the host driver's control nodes and libraries are of
	// no use to it and are not given.
	if slices.ContainsFunc(devices, func(d ClaimDevice) bool { return d.Kind != vocabulary.KindVFIO }) {
		common, err := b.commonEdits(uuids)
		if err != nil {
			return nil, nil, fmt.Errorf("claim %s: %w", claim.UID, err)
		}
		spec.ContainerEdits = common
	}

	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("claim %s: CDI spec version: %w", claim.UID, err)
	}
	spec.Version = version
	return spec, ids, nil
}

// device returns the CDI device for d.
func (b *specBuilder) device(claimUID types.UID, d ClaimDevice) (cdispec.Device, error) {
	name := string(claimUID) + "-" + d.Name
	if err := cdiparser.ValidateDeviceName(name); err != nil {
		return cdispec.Device{}, fmt.Errorf("CDI device name: %w", err)
	}
	if len(d.DeviceNodes)+len(d.CharDevices) == 0 {
		return cdispec.Device{}, fmt.Errorf("no device nodes")
	}
	annotations := make(map[string]string, len(d.Annotations)+7)
	for k, v := range d.Annotations {
		annotations[k] = v
	}
	for k, v := range map[string]string{
		AnnotationRequest: d.Request,
		AnnotationPool:    d.Pool,
		AnnotationDevice:  d.Device,
		AnnotationShareID: d.ShareID,
		AnnotationKind:    string(d.Kind),
		AnnotationUUIDs:   strings.Join(d.UUIDs, ","),
	} {
		if v != "" {
			annotations[k] = v
		}
	}

	var edits cdispec.ContainerEdits
	for _, node := range d.DeviceNodes {
		dn, err := b.deviceNode(node)
		if err != nil {
			return cdispec.Device{}, err
		}
		edits.DeviceNodes = append(edits.DeviceNodes, dn)
	}
	for _, c := range d.CharDevices {
		if !path.IsAbs(c.Path) {
			return cdispec.Device{}, fmt.Errorf("device node %s: path must be absolute", c.Path)
		}
		if c.Major == 0 {
			return cdispec.Device{}, fmt.Errorf("device node %s: major 0 is no device", c.Path)
		}
		mode := charDeviceMode
		// No HostPath: with the type and numbers set, neither the CDI
		// library nor the runtime looks for a file on the host.
		edits.DeviceNodes = append(edits.DeviceNodes, &cdispec.DeviceNode{
			Path: c.Path, Type: "c", Major: int64(c.Major), Minor: int64(c.Minor), FileMode: &mode,
		})
	}
	edits.Env = slices.Clone(d.Env)
	for _, m := range d.Mounts {
		if !path.IsAbs(m.HostPath) || !path.IsAbs(m.ContainerPath) {
			return cdispec.Device{}, fmt.Errorf("mount %s:%s: paths must be absolute", m.HostPath, m.ContainerPath)
		}
		// The plugin made these (an MPS pipe directory) at the host path.
		if _, err := statNamed("mount "+m.ContainerPath, m.HostPath); err != nil {
			return cdispec.Device{}, err
		}
		opts := readWriteMountOptions
		if m.ReadOnly {
			opts = readOnlyMountOptions
		}
		edits.Mounts = append(edits.Mounts, bindMount(m.HostPath, m.ContainerPath, opts))
	}
	return cdispec.Device{Name: name, Annotations: annotations, ContainerEdits: edits}, nil
}

// commonEdits returns the edits every container with at least one device of
// the claim gets: control device nodes, driver libraries and binaries, and
// the environment that describes the claim's devices.
func (b *specBuilder) commonEdits(uuids []string) (cdispec.ContainerEdits, error) {
	var edits cdispec.ContainerEdits
	if len(uuids) > 0 {
		edits.Env = append(edits.Env, EnvVisibleDevices+"="+strings.Join(uuids, ","))
	}
	for _, node := range b.files.DeviceNodes {
		dn, err := b.deviceNode(node)
		if err != nil {
			return edits, err
		}
		edits.DeviceNodes = append(edits.DeviceNodes, dn)
	}
	for _, lib := range b.files.Libraries {
		// Discovered at start; a driver upgrade can remove them since.
		if _, err := statNamed("driver library "+lib.Path, b.driverRoot.join(lib.Path)); err != nil {
			return edits, err
		}
		for _, dir := range b.containerLibDirs {
			for _, name := range lib.Names {
				edits.Mounts = append(edits.Mounts,
					bindMount(b.hostDriverRoot.join(lib.Path), path.Join(dir, name), readOnlyMountOptions))
			}
		}
	}
	for _, bin := range b.files.Binaries {
		if _, err := statNamed("driver binary "+bin.Path, b.driverRoot.join(bin.Path)); err != nil {
			return edits, err
		}
		edits.Mounts = append(edits.Mounts,
			bindMount(b.hostDriverRoot.join(bin.Path), path.Join("/usr/bin", bin.Name), readOnlyMountOptions))
	}
	for _, dir := range b.dirs {
		if _, err := statNamed("driver root directory "+dir, b.driverRoot.join(dir)); err != nil {
			return edits, err
		}
		edits.Mounts = append(edits.Mounts, bindMount(b.hostDriverRoot.join(dir), dir, readOnlyMountOptions))
	}
	slices.SortStableFunc(edits.Mounts, func(a, b *cdispec.Mount) int {
		return strings.Compare(a.ContainerPath, b.ContainerPath)
	})
	return edits, nil
}

// deviceNode describes the device node at p (below the driver root) with the
// type and numbers of the host file, so runtimes need not look at it. The
// numbers are read on every write: the nvidia-uvm major number changes when
// the module is reloaded.
func (b *specBuilder) deviceNode(p string) (*cdispec.DeviceNode, error) {
	if !path.IsAbs(p) {
		return nil, fmt.Errorf("device node %s: path must be absolute", p)
	}
	localPath := b.driverRoot.join(p)
	fi, err := statNamed("device node "+p, localPath)
	if err != nil {
		return nil, err
	}
	info, err := deviceInfo(fi)
	if err != nil {
		return nil, fmt.Errorf("device node %s: %w", localPath, err)
	}
	hostPath := b.hostDriverRoot.join(p)
	dn := &cdispec.DeviceNode{
		Path:     p,
		Type:     info.devType,
		Major:    info.major,
		Minor:    info.minor,
		FileMode: &info.perm,
	}
	if hostPath != p {
		dn.HostPath = hostPath
	}
	return dn, nil
}

// statNamed looks up localPath, which a spec names as what. Every path must
// exist when the spec is written: a node the driver has not made yet (the
// UVM nodes while nvidia-uvm loads on a fresh node, a MIG capability node)
// fails the prepare, which the kubelet retries, instead of a container
// starting without it.
func statNamed(what, localPath string) (os.FileInfo, error) {
	fi, err := os.Stat(localPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s is missing (the kubelet retries the prepare): %w", what, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return fi, nil
}

// devInfo is what a CDI device node needs to know about a device file.
type devInfo struct {
	devType      string
	major, minor int64
	perm         os.FileMode
}

func bindMount(hostPath, containerPath string, opts []string) *cdispec.Mount {
	return &cdispec.Mount{
		HostPath:      hostPath,
		ContainerPath: containerPath,
		Type:          "bind",
		Options:       slices.Clone(opts),
	}
}

// validateClaimUID checks that uid can be used in file and CDI device names.
func validateClaimUID(uid types.UID) error {
	if uid == "" {
		return fmt.Errorf("claim UID is empty")
	}
	if err := cdiparser.ValidateDeviceName(string(uid)); err != nil {
		return fmt.Errorf("claim UID %q cannot be used in CDI names: %w", uid, err)
	}
	return nil
}
