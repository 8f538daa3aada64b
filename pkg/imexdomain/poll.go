package imexdomain

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

// EventPeerUnreachable is the reason of the Event on a ComputeDomain when
// this node's daemon loses a peer.
const EventPeerUnreachable = "IMEXPeerUnreachable"

// reconcile drops this node's stray status entries, and for the joined
// domain follows its peers, polls its daemon and applies the entry.
func (n *Node) reconcile(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if !n.informer.HasSynced() {
		return // no domain is known yet: nothing is dropped, no peer followed
	}
	n.mu.Lock()
	d := n.joined
	n.mu.Unlock()
	for _, stray := range n.strayEntries(d.UID) {
		if err := n.dropEntry(ctx, stray); err != nil {
			logger.Error(err, "Drop this node's entry of a compute domain it no longer serves", "domain", klog.KRef(stray.Namespace, stray.Name))
		}
	}
	if d.UID == "" {
		return
	}
	cd, ok := n.cached(d)
	if ok {
		if peers := peersFrom(cd, n.opts.NodeName, n.opts.NodeIP); !slices.Equal(peers, n.opts.Manager.Peers()) {
			if err := n.opts.Manager.SetPeers(ctx, string(d.UID), peers); err != nil {
				logger.Error(err, "Update the IMEX daemon's peers", "domain", klog.KRef(d.Namespace, d.Name))
			}
		}
	}
	status := n.poll(ctx, d, cd)
	if err := n.applyEntry(ctx, d, status); err != nil {
		logger.Error(err, "Write this node's compute domain status entry", "domain", klog.KRef(d.Namespace, d.Name))
	}
}

// poll asks the daemon for the domain's state: Connected when it reaches
// every peer, Disconnected when it lost one, Starting while a peer never
// connected, Failed when the command service does not answer after it
// answered once (the daemon is then started again if it exited).
func (n *Node) poll(ctx context.Context, d Domain, cd *gpuv1beta1.ComputeDomain) *gpuv1beta1.DaemonStatus {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, n.opts.Ctl, "-c", n.opts.Manager.ConfigPath(string(d.UID)), "-N")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		n.mu.Lock()
		answered := n.last != nil && n.last.Daemon.State != gpuv1beta1.DaemonStarting
		n.mu.Unlock()
		msg := fmt.Sprintf("nvidia-imex-ctl -N: %v: %s", err, strings.TrimSpace(out.String()))
		if !answered {
			return &gpuv1beta1.DaemonStatus{State: gpuv1beta1.DaemonStarting, Message: msg}
		}
		// It answered before: a daemon that died is started again, as at
		// a plugin restart (imex.Manager.Recover adopts one that runs).
		if active, claims := n.opts.Manager.Active(); active == string(d.UID) {
			if rerr := n.opts.Manager.Recover(ctx, map[string][]string{active: claims}); rerr != nil {
				msg += "; restart: " + rerr.Error()
			} else {
				msg += "; the daemon was restarted if it had exited"
			}
		}
		return &gpuv1beta1.DaemonStatus{State: gpuv1beta1.DaemonFailed, Message: msg}
	}
	report := parseCtl(out.String())
	view := report.view(n.opts.NodeIP)
	names := map[string]string{}
	if cd != nil {
		for _, e := range cd.Status.Nodes {
			names[e.IPAddress] = e.Name
		}
	}
	var unreachable, lost []string
	connected := 0
	for ip, cell := range view {
		if cell == "C" {
			connected++
			continue
		}
		name := names[ip]
		if name == "" {
			name = ip
		}
		unreachable = append(unreachable, name)
		if cell == "D" {
			lost = append(lost, name)
		}
	}
	slices.Sort(unreachable)
	slices.Sort(lost)
	n.metrics.set(d, connected, len(unreachable))
	n.recordLost(ctx, d, lost)
	switch {
	case view == nil:
		return &gpuv1beta1.DaemonStatus{State: gpuv1beta1.DaemonStarting, Message: "nvidia-imex-ctl -N lists no row for " + n.opts.NodeIP}
	case len(unreachable) == 0:
		return &gpuv1beta1.DaemonStatus{State: gpuv1beta1.DaemonConnected}
	case len(lost) > 0:
		return &gpuv1beta1.DaemonStatus{State: gpuv1beta1.DaemonDisconnected, UnreachablePeers: unreachable,
			Message: "lost the connection to " + strings.Join(lost, ", ")}
	default:
		return &gpuv1beta1.DaemonStatus{State: gpuv1beta1.DaemonStarting, UnreachablePeers: unreachable,
			Message: "never connected to " + strings.Join(unreachable, ", ")}
	}
}

// recordLost records an Event on the domain for each peer newly lost.
func (n *Node) recordLost(ctx context.Context, d Domain, lost []string) {
	n.mu.Lock()
	var fresh []string
	now := map[string]bool{}
	for _, p := range lost {
		now[p] = true
		if !n.lost[p] {
			fresh = append(fresh, p)
		}
	}
	if n.joined.UID == d.UID {
		n.lost = now
	}
	n.mu.Unlock()
	if n.opts.Events == nil {
		return
	}
	for _, peer := range fresh {
		t := metav1.Now()
		ev := &corev1.Event{
			ObjectMeta: metav1.ObjectMeta{GenerateName: d.Name + ".", Namespace: d.Namespace},
			InvolvedObject: corev1.ObjectReference{APIVersion: gpuv1beta1.GroupVersion.String(), Kind: "ComputeDomain",
				Namespace: d.Namespace, Name: d.Name, UID: d.UID},
			Reason:         EventPeerUnreachable,
			Message:        fmt.Sprintf("The IMEX daemon on node %s lost its connection to peer %s", n.opts.NodeName, peer),
			Type:           corev1.EventTypeWarning,
			Source:         corev1.EventSource{Component: "gpu.dra.dev/kubelet-plugin", Host: n.opts.NodeName},
			FirstTimestamp: t, LastTimestamp: t, Count: 1,
			ReportingController: "gpu.dra.dev/kubelet-plugin", ReportingInstance: n.opts.NodeName,
		}
		if _, err := n.opts.Events.Events(d.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			klog.FromContext(ctx).Error(err, "Record a lost IMEX peer", "domain", klog.KRef(d.Namespace, d.Name), "peer", peer)
		}
	}
}
