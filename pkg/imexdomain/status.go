package imexdomain

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// FieldManager is the field manager of node's entries of ComputeDomain
// status.nodes: each node owns its own entry and nothing else.
func FieldManager(node string) string { return vocabulary.DriverName + "/node-" + node }

// applyEntry applies this node's entry of the domain's status.nodes.
func (n *Node) applyEntry(ctx context.Context, d Domain, daemon *gpuv1beta1.DaemonStatus) error {
	entry := gpuv1beta1.ComputeDomainNode{
		Name: n.opts.NodeName, IPAddress: n.opts.NodeIP, CliqueID: n.Clique(),
		Channel: ptr.To(int32(d.Channel)), Daemon: *daemon,
	}
	n.mu.Lock()
	same := n.last != nil && equalEntry(*n.last, entry)
	n.mu.Unlock()
	if same {
		return nil
	}
	if err := n.apply(ctx, d, []gpuv1beta1.ComputeDomainNode{entry}); err != nil {
		return err
	}
	n.mu.Lock()
	if n.joined.UID == d.UID {
		n.last = &entry
	}
	n.mu.Unlock()
	return nil
}

// dropEntry applies an empty list: the node's entry goes. A domain that is
// gone has no entry to drop.
func (n *Node) dropEntry(ctx context.Context, d Domain) error {
	if err := n.apply(ctx, d, []gpuv1beta1.ComputeDomainNode{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// apply server-side applies nodes as this node's part of the domain's
// status. The UID makes it fail for a domain recreated under the name.
func (n *Node) apply(ctx context.Context, d Domain, nodes []gpuv1beta1.ComputeDomainNode) error {
	list := make([]any, 0, len(nodes))
	for _, e := range nodes {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&e)
		if err != nil {
			return err
		}
		list = append(list, m)
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gpuv1beta1.GroupVersion.String(),
		"kind":       "ComputeDomain",
		"metadata":   map[string]any{"name": d.Name, "namespace": d.Namespace, "uid": string(d.UID)},
		"status":     map[string]any{"nodes": list},
	}}
	_, err := n.opts.Client.Resource(gpuv1beta1.ComputeDomainResource).Namespace(d.Namespace).ApplyStatus(ctx, d.Name, obj,
		metav1.ApplyOptions{FieldManager: FieldManager(n.opts.NodeName), Force: true})
	if err != nil {
		return fmt.Errorf("ComputeDomain %s/%s: apply this node's status entry: %w", d.Namespace, d.Name, err)
	}
	return nil
}

func equalEntry(a, b gpuv1beta1.ComputeDomainNode) bool {
	return a.Name == b.Name && a.IPAddress == b.IPAddress && a.CliqueID == b.CliqueID &&
		ptr.Deref(a.Channel, -1) == ptr.Deref(b.Channel, -1) && a.Daemon.State == b.Daemon.State &&
		a.Daemon.Message == b.Daemon.Message && slices.Equal(a.Daemon.UnreachablePeers, b.Daemon.UnreachablePeers)
}

func fromUnstructured(obj any) (*gpuv1beta1.ComputeDomain, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("not a ComputeDomain: %T", obj)
	}
	cd := &gpuv1beta1.ComputeDomain{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cd); err != nil {
		return nil, err
	}
	return cd, nil
}

// peersOf returns the addresses of the domain's nodes, this node's among
// them, sorted: the daemon's node list. ok is false when the domain could
// not be read (the list is then this node alone).
func (n *Node) peersOf(ctx context.Context, d Domain) ([]string, bool) {
	cd, ok := n.cached(d)
	if !ok {
		u, err := n.opts.Client.Resource(gpuv1beta1.ComputeDomainResource).Namespace(d.Namespace).Get(ctx, d.Name, metav1.GetOptions{})
		if err == nil {
			cd, err = fromUnstructured(u)
		}
		if err != nil {
			return []string{n.opts.NodeIP}, false
		}
	}
	return peersFrom(cd, n.opts.NodeName, n.opts.NodeIP), true
}

func peersFrom(cd *gpuv1beta1.ComputeDomain, node, ip string) []string {
	peers := []string{ip}
	for _, e := range cd.Status.Nodes {
		if e.Name != node && e.IPAddress != "" {
			peers = append(peers, e.IPAddress)
		}
	}
	slices.Sort(peers)
	return slices.Compact(peers)
}
