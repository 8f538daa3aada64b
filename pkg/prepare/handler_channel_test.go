package prepare

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/imexdomain"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// fakeChannels stands for imexdomain.Node: its daemon and status entry
// (joined) outlive an engine's crash, as the real ones do.
type fakeChannels struct {
	clique  string
	domains map[string]*gpuv1beta1.ComputeDomain // in namespace ns, by name
	mu      sync.Mutex
	joined  map[types.UID][]string
}

func (f *fakeChannels) Clique() string { return f.clique }

func (f *fakeChannels) DeviceNode(n int) (cdi.CharDevice, error) {
	if n >= 64 {
		return cdi.CharDevice{}, fmt.Errorf("IMEX channel %d: this node has no such channel", n)
	}
	return cdi.CharDevice{Path: vocabulary.ChannelDevNode(n), Major: 234, Minor: uint32(n)}, nil
}

func (f *fakeChannels) Lookup(_ context.Context, namespace, name string) (*gpuv1beta1.ComputeDomain, error) {
	if cd, ok := f.domains[name]; ok && namespace == "ns" {
		return cd.DeepCopy(), nil
	}
	return nil, fmt.Errorf("ComputeDomain %s/%s: not found", namespace, name)
}

func (f *fakeChannels) Join(_ context.Context, d imexdomain.Domain, claim string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for uid := range f.joined {
		if uid != d.UID {
			return fmt.Errorf("this node serves compute domain %s", uid)
		}
	}
	if !slices.Contains(f.joined[d.UID], claim) {
		f.joined[d.UID] = append(f.joined[d.UID], claim)
	}
	return nil
}

func (f *fakeChannels) Leave(_ context.Context, d imexdomain.Domain, claim string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.joined[d.UID] = slices.DeleteFunc(f.joined[d.UID], func(c string) bool { return c == claim })
	if len(f.joined[d.UID]) == 0 {
		delete(f.joined, d.UID)
	}
	return nil
}

// recover is imex.Manager.Recover's effect: daemons no claim holds stop.
func (f *fakeChannels) recover(held map[imexdomain.Domain][]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keep := map[types.UID][]string{}
	for d, claims := range held {
		keep[d.UID] = append(keep[d.UID], claims...)
	}
	f.joined = keep
}

func (f *fakeChannels) daemons() []types.UID {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.joined))
}

const (
	trayClique    = "sim-cluster.1"
	channelConfig = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"ComputeDomainChannelConfig","domainName":"training"}`
)

// fakeDomain is a ComputeDomain of namespace ns: in template mode or with
// a shared claim, with a reserved channel or none.
func fakeDomain(name string, template bool, channel *int32) *gpuv1beta1.ComputeDomain {
	cd := &gpuv1beta1.ComputeDomain{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name + "-uid")}}
	if template {
		cd.Spec.Channel.ResourceClaimTemplateName = name + "-channel"
	} else {
		cd.Spec.Channel.ResourceClaimName = name + "-channel"
	}
	cd.Status.Channel = channel
	return cd
}

// newChannels serves "training", a shared claim's domain from before
// channel numbers, "train" and "eval", in template mode with channels 5
// and 3, "fresh", in template mode without a channel yet, and "shared", a
// shared claim's domain with channel 3.
func newChannels() *fakeChannels {
	return &fakeChannels{clique: trayClique, domains: map[string]*gpuv1beta1.ComputeDomain{
		"training": fakeDomain("training", false, nil),
		"train":    fakeDomain("train", true, ptr.To[int32](5)),
		"eval":     fakeDomain("eval", true, ptr.To[int32](3)),
		"fresh":    fakeDomain("fresh", true, nil),
		"shared":   fakeDomain("shared", false, ptr.To[int32](3)),
	}, joined: map[types.UID][]string{}}
}

// domainConfig is the channel config naming a domain.
func domainConfig(domain string) resourceapi.DeviceAllocationConfiguration {
	return opaque(resourceapi.AllocationConfigSourceClaim, testDriver,
		fmt.Sprintf(`{"apiVersion":"gpu.dra.dev/v1beta1","kind":"ComputeDomainChannelConfig","domainName":%q}`, domain))
}

// channelClaimOf is a channel claim allocated from clique's pool.
func channelClaimOf(name, clique, device string, configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	claim := allocated(name, []string{device}, configs...)
	claim.Status.Allocation.Devices.Results[0].Pool = vocabulary.ChannelPoolName(clique)
	return claim
}

// A channel claim is prepared only on a node of its clique, for a channel
// the node has, with a ComputeDomainChannelConfig naming a domain that
// exists; other config kinds are refused for a channel, and the channel
// config for a GPU.
func TestPrepareChannelRefusals(t *testing.T) {
	cfg := opaque(resourceapi.AllocationConfigSourceClaim, testDriver, channelConfig)
	for _, tc := range []struct {
		name     string
		channels bool
		claim    *resourceapi.ResourceClaim
		want     string
	}{
		{"other clique", true, channelClaimOf("c", "other.2", "channel-1", cfg), "IMEX channel of NVLink clique other.2 (pool imex-channels.other.2), this node's clique is " + trayClique},
		{"no daemons", false, channelClaimOf("c", trayClique, "channel-1", cfg), "this node's plugin runs no IMEX daemons"},
		{"no config", true, channelClaimOf("c", trayClique, "channel-1"), "needs a ComputeDomainChannelConfig naming its ComputeDomain, the claim has no config"},
		{"GPU config", true, channelClaimOf("c", trayClique, "channel-1", opaque(resourceapi.AllocationConfigSourceClaim, testDriver, exclusive)), "the claim has a GpuConfig"},
		{"unknown domain", true, channelClaimOf("c", trayClique, "channel-1", opaque(resourceapi.AllocationConfigSourceClaim, testDriver,
			`{"apiVersion":"gpu.dra.dev/v1beta1","kind":"ComputeDomainChannelConfig","domainName":"nope"}`)), "ComputeDomain ns/nope: not found"},
		{"not the domain's channel", true, channelClaimOf("c", trayClique, "channel-1", domainConfig("train")),
			"the claim has IMEX channel 1, ComputeDomain ns/train has channel 5 (status.channel)"},
		{"not the shared domain's channel", true, channelClaimOf("c", trayClique, "channel-1", domainConfig("shared")),
			"the claim has IMEX channel 1, ComputeDomain ns/shared has channel 3 (status.channel)"},
		{"template domain without a channel", true, channelClaimOf("c", trayClique, "channel-1", domainConfig("fresh")),
			"ComputeDomain ns/fresh has no IMEX channel reserved (status.channel is unset): claims from its template fresh-channel"},
		{"missing channel", true, channelClaimOf("c", trayClique, "channel-99", cfg), "IMEX channel 99: this node has no such channel"},
		{"not a channel", true, channelClaimOf("c", trayClique, "gpu-0", cfg), `device "gpu-0" is not an IMEX channel`},
		{"channel config on a GPU", true, allocated("g", []string{"gpu-0"}, cfg), "device gpu-0 is a whole GPU: a ComputeDomainChannelConfig does not apply to it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newChannels()
			opts := Options{}
			if tc.channels {
				opts.Channels = f
			}
			d := newTestDriverWith(t, opts)
			if err := prepareOne(t, d, tc.claim); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("prepare: %v, want an error containing %q", err, tc.want)
			}
			if got := d.PreparedClaims(); len(got) != 0 || len(f.daemons()) != 0 {
				t.Errorf("a refused claim left claims %+v, daemons %v", got, f.daemons())
			}
		})
	}
}

// A crash at any point of a channel's prepare or unprepare leaves no
// daemon once the restarted plugin recovered and the kubelet unprepared
// the claim; a claim prepared before the crash keeps its daemon.
func TestChannelCrashConverges(t *testing.T) {
	for _, point := range []string{FaultPrepareStarted, FaultPrepareIMEXDomainRecorded, FaultPrepareCDIWritten, FaultPrepareCompleted, FaultUnprepareStarted, FaultUnprepareCDIGone} {
		t.Run(point, func(t *testing.T) {
			var hook func(string)
			f := newChannels()
			opts, node := testOptionsOn(t, "gb200nvl72", Options{Channels: f, FaultHook: func(p string) {
				if hook != nil {
					hook(p)
				}
			}})
			f.clique = node.GPUs[0].CliqueID
			d := startTestDriver(t, opts, node)
			claim := channelClaimOf("channel", f.clique, "channel-5", opaque(resourceapi.AllocationConfigSourceClaim, testDriver, channelConfig))
			crashDuring(t, d, claim, point, func(h func(string)) { hook = h })

			d = startTestDriver(t, opts, node)
			f.recover(d.HeldDomains())
			if point == FaultPrepareCompleted {
				prepared := d.PreparedClaims()
				if len(prepared) != 1 || prepared[0].State != checkpoint.PrepareCompleted || !slices.Equal(f.daemons(), []types.UID{"training-uid"}) {
					t.Fatalf("after a crash once completed: claims %+v, daemons %v; want the claim and its daemon kept", prepared, f.daemons())
				}
				if ch := prepared[0].Devices[0].IMEXChannel; ch == nil || ch.Channel != 5 || ch.DomainUID != "training-uid" || ch.DomainName != "training" {
					t.Errorf("checkpoint record %+v, want channel 5 of training (training-uid)", ch)
				}
			}
			if err := unprepareOne(t, d, claim); err != nil {
				t.Fatal(err)
			}
			if got := d.PreparedClaims(); len(got) != 0 || len(f.daemons()) != 0 {
				t.Errorf("claims %+v, daemons %v left", got, f.daemons())
			}
		})
	}
}

// A lost checkpoint is rebuilt from the CDI spec with the channel's record:
// the restart keeps the domain's daemon, and unprepare releases it.
func TestChannelRebuiltFromSpec(t *testing.T) {
	f := newChannels()
	opts, node := testOptionsOn(t, "gb200nvl72", Options{Channels: f})
	f.clique = node.GPUs[0].CliqueID
	d := startTestDriver(t, opts, node)
	claim := channelClaimOf("channel", f.clique, "channel-5", opaque(resourceapi.AllocationConfigSourceClaim, testDriver, channelConfig))
	if err := prepareOne(t, d, claim); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(opts.CheckpointPath); err != nil {
		t.Fatal(err)
	}
	d = startTestDriver(t, opts, node)
	held := d.HeldDomains()
	want := imexdomain.Domain{Namespace: "ns", Name: "training", UID: "training-uid", Channel: 5}
	if !slices.Equal(held[want], []string{string(claim.UID)}) {
		t.Fatalf("held domains after the rebuild %v, want %v held by %s", held, want, claim.UID)
	}
	f.recover(held)
	if err := unprepareOne(t, d, claim); err != nil {
		t.Fatal(err)
	}
	if got := f.daemons(); len(got) != 0 {
		t.Errorf("daemons %v left", got)
	}
}

// The per-pod claims of a template-mode domain on one node share its
// channel and its one daemon; a claim of another domain on that channel is
// refused while they hold it, and gets it once they are gone.
func TestTemplateClaimsShareChannel(t *testing.T) {
	f := newChannels()
	opts, node := testOptionsOn(t, "gb200nvl72", Options{Channels: f})
	f.clique = node.GPUs[0].CliqueID
	d := startTestDriver(t, opts, node)
	var claims []*resourceapi.ResourceClaim
	for i := range 4 {
		claim := channelClaimOf(fmt.Sprintf("worker-%d-channel", i), f.clique, "channel-5", domainConfig("train"))
		// The allocator gives each allocation of a multi-allocatable device a share ID.
		claim.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID(fmt.Sprintf("share-%d", i)))
		for range 2 { // the kubelet may prepare a claim again
			if err := prepareOne(t, d, claim); err != nil {
				t.Fatalf("worker %d: %v", i, err)
			}
		}
		claims = append(claims, claim)
	}
	for _, c := range d.PreparedClaims() {
		if got, want := c.Devices[0].ShareID, "share-"+c.Name[len("worker-"):len("worker-")+1]; got != want {
			t.Errorf("claim %s recorded share ID %q, want %q (its allocation's)", c.Name, got, want)
		}
	}
	if got := f.daemons(); !slices.Equal(got, []types.UID{"train-uid"}) {
		t.Fatalf("daemons %v, want train's alone", got)
	}
	if got := len(f.joined["train-uid"]); got != 4 {
		t.Errorf("train's daemon holds %d claims, want 4", got)
	}
	// "training" (no channel number, from before them) on channel 5.
	other := channelClaimOf("other-channel", f.clique, "channel-5", domainConfig("training"))
	if err := prepareOne(t, d, other); err == nil || !strings.Contains(err.Error(), "it is device channel-5") {
		t.Fatalf("another domain's claim on channel 5: %v, want refused", err)
	}
	for _, claim := range claims {
		if err := unprepareOne(t, d, claim); err != nil {
			t.Fatal(err)
		}
	}
	if err := prepareOne(t, d, other); err != nil {
		t.Errorf("channel 5 once train's claims are gone: %v", err)
	}
}

func TestChannelConflict(t *testing.T) {
	rec := func(name, uid string) checkpoint.PreparedDevice {
		return checkpoint.PreparedDevice{Pool: "imex-channels.c", Device: "channel-5", Kind: vocabulary.KindIMEXChannel,
			IMEXChannel: &checkpoint.IMEXChannel{Channel: 5, DomainNamespace: "ns", DomainName: name, DomainUID: uid}}
	}
	for name, tc := range map[string]struct {
		a, b checkpoint.PreparedDevice
		want bool
	}{
		"one domain":          {rec("train", "u1"), rec("train", "u1"), false},
		"one domain, planned": {rec("train", ""), rec("train", "u1"), false},
		"two domains":         {rec("train", "u1"), rec("eval", "u2"), true},
		"a domain recreated":  {rec("train", "u2"), rec("train", "u1"), true},
		"another namespace's name": {rec("train", ""), func() checkpoint.PreparedDevice {
			r := rec("train", "u1")
			r.IMEXChannel.DomainNamespace = "other"
			return r
		}(), true},
		"another channel": {rec("train", "u1"), func() checkpoint.PreparedDevice { r := rec("eval", "u2"); r.Device = "channel-3"; return r }(), false},
		"no record":       {rec("train", "u1"), checkpoint.PreparedDevice{Pool: "imex-channels.c", Device: "channel-5", Kind: vocabulary.KindIMEXChannel}, true},
	} {
		t.Run(name, func(t *testing.T) {
			if got := (channelHandler{}).conflict("", tc.a, tc.b) != ""; got != tc.want {
				t.Errorf("conflict = %v, want %v", got, tc.want)
			}
		})
	}
}

// A channel's node is given to the runtime by its numbers, with no host
// path: the driver makes channel nodes only on request, so the simulated
// driver root's channel5 is removed and the spec is still written.
func TestChannelSpecNamesNodeByNumbers(t *testing.T) {
	f := newChannels()
	opts, node := testOptionsOn(t, "gb200nvl72", Options{Channels: f})
	f.clique = node.GPUs[0].CliqueID
	driverRoot := filepath.Join(filepath.Dir(opts.CheckpointPath), "driver")
	if err := os.Remove(filepath.Join(driverRoot, vocabulary.ChannelDevNode(5))); err != nil {
		t.Fatal(err)
	}
	d := startTestDriver(t, opts, node)
	claim := channelClaimOf("channel", f.clique, "channel-5", opaque(resourceapi.AllocationConfigSourceClaim, testDriver, channelConfig))
	if err := prepareOne(t, d, claim); err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := yaml.Unmarshal(claimSpecFile(t, opts, claim), &spec); err != nil {
		t.Fatal(err)
	}
	if len(spec.Devices) != 1 || len(spec.Devices[0].ContainerEdits.DeviceNodes) != 1 {
		t.Fatalf("spec devices %+v, want one device with one node", spec.Devices)
	}
	got := *spec.Devices[0].ContainerEdits.DeviceNodes[0]
	if got.Path != vocabulary.ChannelDevNode(5) || got.HostPath != "" || got.Type != "c" || got.Major != 234 || got.Minor != 5 ||
		got.FileMode == nil || *got.FileMode != 0o666 {
		t.Errorf("channel node %+v; want %s, no host path, c 234:5, mode 0666", got, vocabulary.ChannelDevNode(5))
	}
}
