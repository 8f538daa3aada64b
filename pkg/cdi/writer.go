package cdi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/atomicfile"
)

// Writer writes, removes and lists the per-claim CDI specs.
type Writer interface {
	// WriteClaimSpec writes (or rewrites) the spec for claim and returns the
	// fully qualified CDI device IDs, one per device in the order given.
	WriteClaimSpec(ctx context.Context, claim ClaimInfo, devices []ClaimDevice) ([]string, error)
	// RemoveClaimSpec removes the claim's spec. A missing spec is not an
	// error.
	RemoveClaimSpec(ctx context.Context, claimUID types.UID) error
	// ListClaimSpecs returns the claim specs in the spec directory, sorted
	// by claim UID, for reconciliation with the checkpoint. Files that are
	// not this driver's claim specs are ignored.
	ListClaimSpecs(ctx context.Context) ([]ClaimSpecInfo, error)
	// RemoveTemps removes the temporary files of claim spec writes that a
	// crash interrupted. Call it only while no write is in progress (at
	// start, before anything is prepared).
	RemoveTemps(ctx context.Context) error
}

// ClaimSpecInfo describes a claim spec found in the spec directory.
type ClaimSpecInfo struct {
	// Claim identifies the claim. When Err is set only the UID (taken from
	// the file name) is known.
	Claim ClaimInfo
	// Path is the spec file.
	Path string
	// Devices are the spec's devices in file order.
	Devices []ClaimSpecDevice
	// Err is set when the file is named like a claim spec of this driver but
	// cannot be read, parsed or validated. Such a file is of no use to a
	// runtime; the caller should remove it.
	Err error
}

// ClaimSpecDevice is a device of a claim spec, rebuilt from its annotations.
type ClaimSpecDevice struct {
	// ID is the fully qualified CDI device ID.
	ID string
	// Name is the device's name within the claim (ClaimDevice.Name).
	Name string
	DeviceRecord
	// Annotations are all of the device's annotations, including the ones
	// above and those from ClaimDevice.Annotations.
	Annotations map[string]string
}

// Option configures a Writer.
type Option func(*writer)

// WithContainerLibDirs sets the container directories the driver libraries
// are mounted into. The default is the standard 64-bit library directories
// of Debian-like and Red Hat-like images; see docs/cdi.md.
func WithContainerLibDirs(dirs ...string) Option {
	return func(w *writer) { w.builder.containerLibDirs = slices.Clone(dirs) }
}

// WithDriverRootDirs mounts directories below the driver root, read-only,
// at the same absolute path into every container of the writer's specs: a
// simulated driver's process socket directory (pkg/nvmlsim), where a real
// driver has its persistenced socket.
func WithDriverRootDirs(dirs ...string) Option {
	return func(w *writer) { w.builder.dirs = slices.Clone(dirs) }
}

// WithHostDriverRoot sets where the host, and so the container runtime, sees
// the driver root, when the plugin sees it elsewhere: a plugin container that
// mounts a host-installed driver ("/") at /driver-root reads files below
// /driver-root but must name /usr/lib/... and /dev/... in specs. Empty or
// unset means the driver root the writer reads.
func WithHostDriverRoot(hostRoot string) Option {
	return func(w *writer) {
		if hostRoot != "" {
			w.builder.hostDriverRoot = root(hostRoot)
		}
	}
}

type writer struct {
	specDir string
	builder specBuilder

	// dirMu guards dirReady and fileOpts: the spec directory is created
	// and its file system looked at once, not on every write.
	dirMu    sync.Mutex
	dirReady bool
	// fileOpts are the atomicfile options for specs: Volatile on a file
	// system a reboot erases (the default /var/run/cdi is tmpfs), since
	// the claims a spec serves do not survive a reboot either (see
	// docs/cdi.md).
	fileOpts []atomicfile.Option

	validator specValidator
}

// specFileMode is the permission of spec files; runtimes read them as root,
// operators may read them for debugging.
const specFileMode = 0o644

// NewWriter returns a Writer that keeps specs in specDir (on the host,
// usually DefaultSpecDir). driverRoot is the directory the driver files and
// device nodes are below, as this process sees it (see WithHostDriverRoot);
// files describes the driver files in it.
func NewWriter(specDir, driverRoot string, files *DriverFiles, opts ...Option) Writer {
	if driverRoot == "" {
		driverRoot = "/"
	}
	if files == nil {
		files = &DriverFiles{}
	}
	w := &writer{
		specDir: specDir,
		builder: specBuilder{
			driverRoot:       root(driverRoot),
			hostDriverRoot:   root(driverRoot),
			files:            files,
			containerLibDirs: defaultContainerLibDirs(runtime.GOARCH),
		},
	}
	for _, opt := range opts {
		opt(w)
	}
	return w
}

// defaultContainerLibDirs are directories the dynamic linker of glibc-based
// images searches by default, without LD_LIBRARY_PATH or ld.so.cache entries:
// the Debian multiarch directory and the Red Hat/SUSE lib64 directory.
func defaultContainerLibDirs(goarch string) []string {
	var dirs []string
	if triplet := multiarchTriplet(goarch); triplet != "" {
		dirs = append(dirs, "/usr/lib/"+triplet)
	}
	return append(dirs, "/usr/lib64")
}

// WriteClaimSpec implements Writer.
func (w *writer) WriteClaimSpec(ctx context.Context, claim ClaimInfo, devices []ClaimDevice) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	spec, ids, err := w.builder.build(claim, devices)
	if err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode CDI spec for claim %s: %w", claim.UID, err)
	}
	specPath := w.specPath(claim.UID)
	// Validate with the CDI library's own reader, as runtimes will read
	// the spec, before the file becomes visible.
	validate := func(tmpPath string) error { return w.validator.check(specPath, tmpPath, spec) }
	for try := 0; ; try++ {
		fileOpts, err := w.prepareDir(try > 0)
		if err != nil {
			return nil, err
		}
		err = atomicfile.WriteFile(specPath, data, specFileMode, append(fileOpts, atomicfile.WithVerify(validate))...)
		if err == nil {
			break
		}
		if try > 0 || !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("write CDI spec for claim %s: %w", claim.UID, err)
		}
		// The directory was removed since it was created: again.
	}
	klog.FromContext(ctx).V(4).Info("Wrote CDI spec", "claimUID", claim.UID, "path", specPath, "devices", ids)
	return ids, nil
}

// prepareDir creates the spec directory, the first time or again, and
// returns the options of the specs' files on its file system.
func (w *writer) prepareDir(again bool) ([]atomicfile.Option, error) {
	w.dirMu.Lock()
	defer w.dirMu.Unlock()
	if w.dirReady && !again {
		return w.fileOpts, nil
	}
	if err := os.MkdirAll(w.specDir, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI spec directory: %w", err)
	}
	volatile, err := volatileFS(w.specDir)
	if err != nil {
		return nil, fmt.Errorf("find the file system of CDI spec directory %s: %w", w.specDir, err)
	}
	w.fileOpts = nil
	if volatile {
		w.fileOpts = []atomicfile.Option{atomicfile.Volatile()}
	}
	w.dirReady = true
	return w.fileOpts, nil
}

// RemoveClaimSpec implements Writer.
func (w *writer) RemoveClaimSpec(ctx context.Context, claimUID types.UID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validateClaimUID(claimUID); err != nil {
		return err
	}
	specPath := w.specPath(claimUID)
	w.dirMu.Lock()
	fileOpts := w.fileOpts
	w.dirMu.Unlock()
	if err := atomicfile.Remove(specPath, fileOpts...); err != nil {
		return fmt.Errorf("remove CDI spec for claim %s: %w", claimUID, err)
	}
	if err := atomicfile.RemoveTemps(specPath); err != nil {
		return fmt.Errorf("remove temporary CDI spec files for claim %s: %w", claimUID, err)
	}
	klog.FromContext(ctx).V(4).Info("Removed CDI spec", "claimUID", claimUID, "path", specPath)
	return nil
}

// ListClaimSpecs implements Writer.
func (w *writer) ListClaimSpecs(ctx context.Context) ([]ClaimSpecInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(w.specDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list CDI specs: %w", err)
	}
	var infos []ClaimSpecInfo
	for _, e := range entries {
		uid, ok := claimUIDFromFileName(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		info, ours := readClaimSpec(filepath.Join(w.specDir, e.Name()), uid)
		if ours {
			infos = append(infos, info)
		}
	}
	slices.SortFunc(infos, func(a, b ClaimSpecInfo) int {
		return strings.Compare(string(a.Claim.UID), string(b.Claim.UID))
	})
	return infos, nil
}

// RemoveTemps implements Writer.
func (w *writer) RemoveTemps(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	entries, err := os.ReadDir(w.specDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list CDI spec directory: %w", err)
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !atomicfile.IsTemp(name) || !strings.HasPrefix(name, "."+specFilePrefix) {
			continue
		}
		if err := os.Remove(filepath.Join(w.specDir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove temporary CDI spec files: %w", err)
	}
	return nil
}

// readClaimSpec reads the spec file at specPath, named for claim uid. It
// reports false for a readable spec of another kind (not ours).
func readClaimSpec(specPath string, uid types.UID) (ClaimSpecInfo, bool) {
	info := ClaimSpecInfo{Claim: ClaimInfo{UID: uid}, Path: specPath}
	spec, err := cdiapi.ReadSpec(specPath, 0)
	if err != nil {
		info.Err = err
		return info, true
	}
	if spec.Kind != Kind {
		return info, false
	}
	if got := spec.Annotations[AnnotationClaimUID]; got != string(uid) {
		info.Err = fmt.Errorf("CDI spec %s is for claim UID %q, its file name says %q", specPath, got, uid)
		return info, true
	}
	info.Claim.Namespace = spec.Annotations[AnnotationClaimNamespace]
	info.Claim.Name = spec.Annotations[AnnotationClaimName]
	prefix := string(uid) + "-"
	for _, d := range spec.Devices {
		a := d.Annotations
		dev := ClaimSpecDevice{
			ID:   cdiparser.QualifiedName(Vendor, Class, d.Name),
			Name: strings.TrimPrefix(d.Name, prefix),
			DeviceRecord: DeviceRecord{
				Request: a[AnnotationRequest],
				Pool:    a[AnnotationPool],
				Device:  a[AnnotationDevice],
				ShareID: a[AnnotationShareID],
				Kind:    vocabulary.Kind(a[AnnotationKind]),
			},
			Annotations: a,
		}
		if u := a[AnnotationUUIDs]; u != "" {
			dev.UUIDs = strings.Split(u, ",")
		}
		info.Devices = append(info.Devices, dev)
	}
	return info, true
}

// specFilePrefix starts the file names of claim specs; the claim UID and
// ".json" follow.
var specFilePrefix = cdiapi.GenerateTransientSpecName(Vendor, Class, "")

const specFileExt = ".json"

func (w *writer) specPath(uid types.UID) string {
	return filepath.Join(w.specDir, cdiapi.GenerateTransientSpecName(Vendor, Class, string(uid))+specFileExt)
}

// claimUIDFromFileName returns the claim UID in a claim spec file name.
func claimUIDFromFileName(name string) (types.UID, bool) {
	rest, ok := strings.CutPrefix(name, specFilePrefix)
	if !ok {
		return "", false
	}
	uid, ok := strings.CutSuffix(rest, specFileExt)
	if !ok || validateClaimUID(types.UID(uid)) != nil {
		return "", false
	}
	return types.UID(uid), true
}
