package prepare

import (
	"context"
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/imexdomain"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Channels serves the IMEX channels of compute domains
// (docs/compute-domains.md); *imexdomain.Node implements it.
type Channels interface {
	// Clique is this node's NVLink clique, "" when it has none.
	Clique() string
	// DeviceNode is channel n's device node for a container, by its
	// numbers, or an error when the node's driver has no channels.
	DeviceNode(n int) (cdi.CharDevice, error)
	// Lookup returns the ComputeDomain namespace/name as the API server
	// has it: its UID and reserved channel (status.channel).
	Lookup(ctx context.Context, namespace, name string) (*gpuv1beta1.ComputeDomain, error)
	// Join starts or joins the domain's IMEX daemon for the claim and
	// writes the node's status entry; Leave undoes it, tolerating a claim
	// that never joined.
	Join(ctx context.Context, d imexdomain.Domain, claim string) error
	Leave(ctx context.Context, d imexdomain.Domain, claim string) error
}

// FaultPrepareIMEXDomainRecorded is reached once a channel's domain UID is
// in the checkpoint, before its daemon is joined (also when the join is then
// refused). The fault campaign (test/campaign) prepares channel claims and
// kills there; TestChannelCrashConverges visits it at engine level.
const FaultPrepareIMEXDomainRecorded = "prepare:imex-domain-recorded"

// lockIMEX serializes the channel work of a node: one IMEX daemon.
const lockIMEX = "imex-channels"

// planChannel maps a result from a clique's channel pool to its record. A
// channel is prepared on every node of its clique that runs a pod of the
// domain: the pool is not the node's, so the node checks that it is in the
// channel's clique and has the channel.
func (d *Engine) planChannel(claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult, clique string) (checkpoint.PreparedDevice, error) {
	pd := checkpoint.PreparedDevice{Request: r.Request, Pool: r.Pool, Device: r.Device, Kind: vocabulary.KindIMEXChannel}
	if r.ShareID != nil { // a channel device is allocated to every claim of its domain
		pd.ShareID = string(*r.ShareID)
	}
	if d.opts.Channels == nil {
		return pd, fmt.Errorf("request %q: device %s of pool %s is an IMEX channel: this node's plugin runs no IMEX daemons", r.Request, r.Device, r.Pool)
	}
	if isAdmin(r) {
		return pd, fmt.Errorf("request %q: device %s is an IMEX channel: admin access does not apply to it", r.Request, r.Device)
	}
	if own := d.opts.Channels.Clique(); own != clique {
		if own == "" {
			own = "none: its GPUs have no multi-node NVLink fabric"
		}
		return pd, fmt.Errorf("request %q: device %s is an IMEX channel of NVLink clique %s (pool %s), this node's clique is %s: "+
			"a compute domain's pods must run on nodes of its channel's clique", r.Request, r.Device, clique, r.Pool, own)
	}
	n, err := vocabulary.ChannelNumber(r.Device)
	if err != nil {
		return pd, fmt.Errorf("request %q: %w", r.Request, err)
	}
	if _, err := d.opts.Channels.DeviceNode(n); err != nil {
		return pd, fmt.Errorf("request %q: device %s: %w", r.Request, r.Device, err)
	}
	cfg, err := d.requestConfig(claim, r.Request)
	if err != nil {
		return pd, err
	}
	c, ok := cfg.(*gpuv1beta1.ComputeDomainChannelConfig)
	if !ok {
		got := "no config"
		if cfg != nil {
			got = "a " + cfg.GetObjectKind().GroupVersionKind().Kind
		}
		return pd, fmt.Errorf("request %q: device %s is an IMEX channel: it needs a %s naming its ComputeDomain, the claim has %s",
			r.Request, r.Device, gpuv1beta1.ComputeDomainChannelConfigKind, got)
	}
	pd.IMEXChannel = &checkpoint.IMEXChannel{Channel: n, DomainNamespace: claim.Namespace, DomainName: c.DomainName}
	return pd, nil
}

// channelHandler prepares an IMEX channel of a compute domain: it looks
// the domain up, records it, and joins the domain's IMEX daemon on this
// node; the container gets the channel's device node.
type channelHandler struct{}

// plan is planChannel's (the pool is not the node's, the record needs the
// engine); the config check is here so configs of other kinds are refused
// for a channel as they are for GPUs.
func (channelHandler) plan(_ *devicemodel.Published, r resourceapi.DeviceRequestAllocationResult, cfg gpuv1beta1.Config, _ *checkpoint.PreparedDevice) (shareInput, error) {
	return shareInput{}, fmt.Errorf("device %s is an IMEX channel: it is planned from its clique's pool, not %s", r.Device, r.Pool)
}

func domainOf(pd *checkpoint.PreparedDevice) imexdomain.Domain {
	return imexdomain.Domain{
		Namespace: pd.IMEXChannel.DomainNamespace, Name: pd.IMEXChannel.DomainName,
		UID: types.UID(pd.IMEXChannel.DomainUID), Channel: pd.IMEXChannel.Channel,
	}
}

func (channelHandler) prepare(ctx context.Context, d *Engine, entry *checkpoint.PreparedClaim, pd *checkpoint.PreparedDevice, _ shareInput) error {
	if pd.IMEXChannel == nil || d.opts.Channels == nil {
		return fmt.Errorf("device %s: no IMEX channel record", pd.Device)
	}
	cd, err := d.opts.Channels.Lookup(ctx, entry.Namespace, pd.IMEXChannel.DomainName)
	if err != nil {
		return fmt.Errorf("device %s: %w", pd.Device, err)
	}
	if err := checkDomainChannel(cd, pd); err != nil {
		return fmt.Errorf("device %s: %w", pd.Device, err)
	}
	// Recorded before the daemon is joined: a crash after the join leaves
	// a record that unprepare and recovery release.
	pd.IMEXChannel.DomainUID = string(cd.UID)
	if err := d.put(ctx, entry); err != nil {
		return err
	}
	d.fault(FaultPrepareIMEXDomainRecorded)
	if err := d.opts.Channels.Join(ctx, domainOf(pd), string(entry.UID)); err != nil {
		return fmt.Errorf("device %s: %w", pd.Device, err)
	}
	return nil
}

// checkDomainChannel refuses a channel the domain did not reserve. Channel
// devices may be allocated many times, so what keeps two domains off one
// channel is dra-controller's reservation (status.channel, unique among
// live domains), which every claim the controller makes for the domain
// selects: another channel is a claim made by hand or a stale one, and
// would let the pod into another domain's channel. A domain without a
// reservation is refused in template mode; a shared claim's domain from
// before reservations is let through (its claim was allocated when the
// allocator still kept channels apart), until the controller adopts it.
func checkDomainChannel(cd *gpuv1beta1.ComputeDomain, pd *checkpoint.PreparedDevice) error {
	n := pd.IMEXChannel.Channel
	switch k := cd.Status.Channel; {
	case k == nil && cd.Spec.Channel.ResourceClaimTemplateName != "":
		return fmt.Errorf("ComputeDomain %s/%s has no IMEX channel reserved (status.channel is unset): "+
			"claims from its template %s are prepared once dra-controller has reserved one", cd.Namespace, cd.Name, cd.Spec.Channel.ResourceClaimTemplateName)
	case k != nil && int(*k) != n:
		return fmt.Errorf("the claim has IMEX channel %d, ComputeDomain %s/%s has channel %d (status.channel): "+
			"a compute domain's claims get only its own channel", n, cd.Namespace, cd.Name, *k)
	}
	return nil
}

func (channelHandler) unprepare(ctx context.Context, d *Engine, claimUID types.UID, pd *checkpoint.PreparedDevice) error {
	if pd.IMEXChannel == nil || pd.IMEXChannel.DomainUID == "" {
		return nil // never joined
	}
	if d.opts.Channels == nil {
		return fmt.Errorf("an IMEX channel of ComputeDomain %s/%s is recorded, but this plugin runs no IMEX daemons: "+
			"start it with --imex-node-ip (chart: kubeletPlugin.imex.enabled) to stop the domain's daemon and unprepare the claim",
			pd.IMEXChannel.DomainNamespace, pd.IMEXChannel.DomainName)
	}
	return d.opts.Channels.Leave(ctx, domainOf(pd), string(claimUID))
}

// containerEdits is not reached: channelEdits replaces the engine's
// GPU-based edits for a channel.
func (channelHandler) containerEdits(_ *Engine, _ *devicemodel.Published, pd *checkpoint.PreparedDevice, _ *cdi.ClaimDevice) error {
	return fmt.Errorf("device %s is an IMEX channel: no GPU edits", pd.Device)
}

// channelEdits is what a container gets for a channel: its device node,
// by numbers read at every write (no host file: the driver makes channel
// nodes only on request, and the major changes when the module is
// reloaded), and the record, for a rebuilt checkpoint. A device node path
// recorded by an older release is not used for the same reasons.
func (d *Engine) channelEdits(pd checkpoint.PreparedDevice) (cdi.ClaimDevice, error) {
	cd := cdi.ClaimDevice{Name: pd.Device, DeviceRecord: cdi.DeviceRecord{
		Request: pd.Request, Pool: pd.Pool, Device: pd.Device, ShareID: pd.ShareID, Kind: pd.Kind,
	}}
	if pd.IMEXChannel == nil {
		return cd, fmt.Errorf("device %s: no IMEX channel record", pd.Device)
	}
	if d.opts.Channels == nil {
		return cd, fmt.Errorf("device %s: this plugin runs no IMEX daemons", pd.Device)
	}
	node, err := d.opts.Channels.DeviceNode(pd.IMEXChannel.Channel)
	if err != nil {
		return cd, fmt.Errorf("device %s: %w", pd.Device, err)
	}
	cd.CharDevices = []cdi.CharDevice{node}
	data, err := json.Marshal(pd.IMEXChannel)
	if err != nil {
		return cd, err
	}
	cd.Annotations = map[string]string{annotationIMEXChannel: string(data)}
	return cd, nil
}

// annotationIMEXChannel is a channel device's checkpoint record (JSON), so
// a rebuilt checkpoint still releases the domain's daemon.
const annotationIMEXChannel = "gpu.dra.dev/imex-channel"

// durableStart: joining a domain starts a daemon and writes a status entry
// that outlive a crash.
func (channelHandler) durableStart() bool { return true }

func (channelHandler) strategy(*checkpoint.PreparedDevice) gpuv1beta1.SharingStrategy { return "" }

// conflict: a channel is no GPU. Claims of one domain share its channel
// (a claim per pod, from the domain's template); claims of two domains on
// one channel would open each domain's memory to the other.
func (channelHandler) conflict(_ string, a, b checkpoint.PreparedDevice) string {
	if a.Device != b.Device || a.Pool != b.Pool {
		return ""
	}
	if sameDomain(a.IMEXChannel, b.IMEXChannel) {
		return ""
	}
	return sameDevice(b)
}

// sameDomain: both records name one domain. A planned record has no UID
// yet (it is looked up at prepare); the daemon's join tells a domain
// recreated under the same name from the one the node serves.
func sameDomain(a, b *checkpoint.IMEXChannel) bool {
	if a == nil || b == nil || a.DomainNamespace != b.DomainNamespace || a.DomainName != b.DomainName {
		return false
	}
	return a.DomainUID == "" || b.DomainUID == "" || a.DomainUID == b.DomainUID
}

// HeldDomains lists the compute domains the checkpoint's channels hold, with
// their claims: what imexdomain.Node.Recover keeps after a restart.
func (d *Engine) HeldDomains() map[imexdomain.Domain][]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	held := map[imexdomain.Domain][]string{}
	for uid, c := range d.cp.All() {
		for i := range c.Devices {
			pd := &c.Devices[i]
			if pd.Kind == vocabulary.KindIMEXChannel && pd.IMEXChannel != nil && pd.IMEXChannel.DomainUID != "" {
				dom := domainOf(pd)
				held[dom] = append(held[dom], string(uid))
			}
		}
	}
	return held
}
