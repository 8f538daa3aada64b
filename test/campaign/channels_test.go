package campaign

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/computedomain"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/imexchannels"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/nodelabels"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Compute domains (docs/compute-domains.md): channel claims of two or three
// ComputeDomains, as dra-controller creates them (computedomain.ChannelClaim),
// allocated by the upstream allocator from the channel pool it publishes for
// the node's clique (imexchannels.Resources). The child's plugin runs the
// domains' IMEX daemons (cmd/imex-sim) and looks the domains up in a fake
// API of its own. The simulated DGX H100 has an NVLink fabric, so a clique,
// but its driver root no channel device nodes: the campaign makes the pool's,
// as the driver does when its module parameters ask for channels.

// kindChannel is a compute domain's IMEX channel.
const kindChannel = "channel"

// imexFile, in the root, is what the child needs to run the domains' daemons.
const imexFile = "imex.json"

// imexSetup is imexFile's content.
type imexSetup struct {
	Daemon     string   `json:"daemon"`
	NodeIP     string   `json:"nodeIP"`
	ServerPort int      `json:"serverPort"`
	CmdPort    int      `json:"cmdPort"`
	Domains    []string `json:"domains"`
	// Channels is the pool's size: the driver root gets as many channel
	// device nodes.
	Channels int `json:"channels"`
}

// Tallies of the channel claims, in the summary (not faults).
const (
	tallyChannelPrepared = "channel claim prepared"
	tallyChannelRefused  = "channel claim refused: node serves another domain"
	tallyDomainChanged   = "channel claim of another domain than the last"
	tallyDomainEnded     = "domain's channel claims all unprepared at once"
)

// preparedChannel counts a channel claim the kubelet got prepared.
func (r *run) preparedChannel(c *claim) {
	r.kinds[tallyChannelPrepared+" of "+c.domain]++
	if r.lastDomain != "" && r.lastDomain != c.domain {
		r.kinds[tallyDomainChanged]++
	}
	r.lastDomain = c.domain
}

// computeDomain is the ComputeDomain name as the campaign's API holds it,
// with the channel number dra-controller reserved for it (status.channel:
// its index among the campaign's domains, "domain-a" 0). Every other domain
// is in template mode (a claim per pod, spec.channel.resourceClaimTemplateName),
// the others have a shared claim named claimName. Either way the campaign
// gives a domain several channel claims at a time, all of the domain's
// channel, which share the domain's daemon on the node.
func computeDomain(name, claimName string) *gpuv1beta1.ComputeDomain {
	k := domainChannel(name)
	cd := &gpuv1beta1.ComputeDomain{
		TypeMeta:   metav1.TypeMeta{APIVersion: gpuv1beta1.GroupVersion.String(), Kind: gpuv1beta1.ComputeDomainKind},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: domainUID(name)},
		Spec:       gpuv1beta1.ComputeDomainSpec{Channel: gpuv1beta1.ComputeDomainChannel{ResourceClaimName: claimName}},
		Status:     gpuv1beta1.ComputeDomainStatus{Channel: &k},
	}
	if k%2 == 1 {
		cd.Spec.Channel = gpuv1beta1.ComputeDomainChannel{ResourceClaimTemplateName: name + "-channel"}
	}
	return cd
}

// domainChannel is the channel number of domain-<letter>.
func domainChannel(name string) int32 { return int32(name[len(name)-1] - 'a') }

func domainUID(name string) types.UID { return types.UID(name + "-uid") }

// setUpChannels prepares the node for channel claims: the imex-sim binary,
// the daemons' address and ports, two or three domains, and the clique's
// channel pool in the allocator's view (the node labelled with its clique,
// as dra-controller labels it).
func (r *run) setUpChannels(gpuSlices []*resourceapi.ResourceSlice) error {
	bin, err := pluginrun.BuildIMEX(r.dirs.Root)
	if err != nil {
		return err
	}
	ports, err := freePorts("127.0.0.1", 2)
	if err != nil {
		return err
	}
	labels := nodelabels.Labels(driverName, gpuSlices)
	clique := labels[vocabulary.LabelClique]
	if clique == "" {
		return fmt.Errorf("the simulated %s has no NVLink clique label %s: no channel pool", machine, vocabulary.LabelClique)
	}
	r.cluster.NodeLabels = map[string]map[string]string{nodeName: labels}
	r.channelPool = channelSlices(clique, imexchannels.DefaultChannels)
	r.cluster.Slices = append(slices.Clone(gpuSlices), r.channelPool...)
	for i := range 2 + r.rng.IntN(2) {
		r.domains = append(r.domains, fmt.Sprintf("domain-%c", 'a'+i))
	}
	data, err := json.Marshal(imexSetup{
		Daemon: bin, NodeIP: "127.0.0.1", ServerPort: ports[0], CmdPort: ports[1],
		Domains: r.domains, Channels: imexchannels.DefaultChannels,
	})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.dirs.Root, imexFile), data, 0o644)
}

// channelSlices are the ResourceSlices of the clique's channel pool as
// dra-controller publishes them: no node, the pool's node selector.
func channelSlices(clique string, channels int) []*resourceapi.ResourceSlice {
	res := imexchannels.Resources([]string{clique}, channels)
	var out []*resourceapi.ResourceSlice
	for _, name := range slices.Sorted(maps.Keys(res.Pools)) {
		pool := res.Pools[name]
		for i, s := range pool.Slices {
			out = append(out, &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, i)},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:       driverName,
					Pool:         resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
					NodeSelector: pool.NodeSelector,
					Devices:      s.Devices,
				},
			})
		}
	}
	return out
}

// freePorts returns n ports free on ip now; the daemons of all domains use
// them, one daemon at a time.
func freePorts(ip string, n int) ([]int, error) {
	var out []int
	for range n {
		ln, err := net.Listen("tcp", ip+":0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// configureIMEX gives the child's plugin the domains' daemons and their
// channels' device nodes, if the campaign set them up.
func configureIMEX(root string, cfg *nodeplugin.Config) error {
	data, err := os.ReadFile(filepath.Join(root, imexFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var s imexSetup
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("%s: %w", imexFile, err)
	}
	hook := cfg.SimulationHook
	cfg.SimulationHook = func(m *nvmlsim.Machine) {
		hook(m)
		if err := m.SetIMEXChannels(s.Channels); err != nil {
			fmt.Fprintln(os.Stderr, "campaign: IMEX channel device nodes:", err)
		}
	}
	var cds []*gpuv1beta1.ComputeDomain
	for _, name := range s.Domains {
		cds = append(cds, computeDomain(name, name+"-channel"))
	}
	client, err := apiserver.ComputeDomains(cds...)
	if err != nil {
		return err
	}
	cfg.IMEX = nodeplugin.IMEXConfig{
		NodeIP: s.NodeIP, Daemon: s.Daemon, ServerPort: s.ServerPort, CmdPort: s.CmdPort,
		PollPeriod: 500 * time.Millisecond, DynamicClient: client,
	}
	return nil
}

// newChannelClaim is a fresh channel claim of a domain channelDomain picks;
// nil when none may be picked.
func (r *run) newChannelClaim(name string) (*resourceapi.ResourceClaim, string) {
	domain := r.channelDomain()
	if domain == "" {
		return nil, ""
	}
	cd := computeDomain(domain, name)
	if cd.Spec.Channel.ResourceClaimTemplateName == "" {
		return computedomain.ChannelClaim(cd, driverName, *cd.Status.Channel), domain
	}
	// A pod's claim, as the resource claim controller makes it from the
	// domain's template.
	tmpl := computedomain.ChannelClaimTemplate(cd, driverName, *cd.Status.Channel)
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cd.Namespace}, Spec: tmpl.Spec.Spec}, domain
}

// channelDomain picks the domain of a fresh channel claim, among those
// with fewer than maxDomainClaims live claims: half the time one of the live
// channel claims' (the node serves it, or may), else any, which the node
// refuses while it serves another; the refused claims' retries take the node
// over once the served domain's claims are gone. With mustServe (a fresh
// claim right after a restart, which must prepare) only a domain the node
// serves or may serve: "" when that is not known (live claims of several
// domains raced, the plugin may hold any of them) or none has room.
func (r *run) channelDomain() string {
	live := r.liveDomains()
	room := slices.DeleteFunc(slices.Clone(r.domains), func(d string) bool { return live[d] >= maxDomainClaims })
	served := slices.DeleteFunc(slices.Sorted(maps.Keys(live)), func(d string) bool { return !slices.Contains(room, d) })
	switch {
	case r.mustServe && len(live) > 1:
		return ""
	case r.mustServe && len(live) == 1:
		if len(served) == 0 {
			return ""
		}
		return served[0]
	case len(served) > 0 && r.rng.IntN(2) == 0:
		return served[r.rng.IntN(len(served))]
	case len(room) == 0:
		return ""
	}
	return room[r.rng.IntN(len(room))]
}

// maxDomainClaims bounds a domain's live channel claims: several share its
// daemon, and few enough go that the node changes domains now and then.
const maxDomainClaims = 2

// liveDomains counts the live channel claims by domain.
func (r *run) liveDomains() map[string]int {
	out := map[string]int{}
	for _, c := range r.claims {
		if c.kind == kindChannel {
			out[c.domain]++
		}
	}
	return out
}

// endDomain ends a compute domain's job on the node: the kubelet unprepares
// all its live channel claims at once (its pods end together; the random
// kills of batch(true) land among such calls too). The node may then serve
// another domain: the refused claims' retries and fresh claims take it over.
func (r *run) endDomain() {
	live := r.liveDomains()
	if len(live) == 0 {
		r.batch(false)
		return
	}
	domains := slices.Sorted(maps.Keys(live))
	domain := domains[r.rng.IntN(len(domains))]
	var actions []*action
	for _, c := range r.sortedClaims() {
		if c.kind == kindChannel && c.domain == domain {
			actions = append(actions, &action{c: c})
		}
	}
	r.kinds[tallyDomainEnded]++
	r.execute(actions, false)
}

// refusedForOtherDomain: a channel claim's prepare the node may refuse, as
// a node serves one compute domain at a time, while a live claim of another
// domain (live before the calls: domains) may hold its IMEX daemon.
func refusedForOtherDomain(c *claim, err error, domains map[string]int) bool {
	if c.kind != kindChannel || err == nil || !oneDomainAtATime.MatchString(err.Error()) {
		return false
	}
	for d := range domains {
		if d != c.domain {
			return true
		}
	}
	return false
}

// oneDomainAtATime is how imexdomain and imex refuse a second domain.
var oneDomainAtATime = regexp.MustCompile(`a node serves one (compute )?domain at a time`)

// fromChannelPool: the device is the controller's, not the node's.
func fromChannelPool(r resourceapi.DeviceRequestAllocationResult) bool {
	_, ok := vocabulary.ChannelPoolClique(r.Pool)
	return ok
}
