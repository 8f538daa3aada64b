// Package hypernodes keeps one Volcano HyperNode (topology.volcano.sh) of
// tier 1 per NVLink clique: its members are the nodes labelled
// vocabulary.LabelClique with the clique's ID. Volcano's
// network-topology-aware scheduling then places a Job with
// networkTopology {mode: hard, highestTierAllowed: 1} as a gang inside one
// clique, where its ComputeDomain's channel can serve every pod
// (docs/compute-domains.md "Scheduling").
//
// The members are exact node names rather than a labelMatch on the clique
// label: vc-scheduler (ed72c7c) re-resolves a label selector only for nodes
// that match it after a change, so a node that leaves a clique would stay a
// member of its old HyperNode until something else rebuilt it; a changed
// member list is rebuilt at once.
package hypernodes

import (
	"crypto/sha256"
	"encoding/hex"
	"reflect"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/modelclasses"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Resource is Volcano's HyperNode resource (cluster-scoped).
var Resource = schema.GroupVersionResource{Group: "topology.volcano.sh", Version: "v1alpha1", Resource: "hypernodes"}

const (
	// Kind is the HyperNode kind.
	Kind = "HyperNode"
	// Tier is the tier of a clique's HyperNode: the lowest, so that
	// highestTierAllowed: 1 keeps a Job inside one clique.
	Tier = 1
	// TierName names the tier (a Job may say highestTierName: nvlink-clique).
	TierName = "nvlink-clique"
	// namePrefix starts the name of a clique's HyperNode.
	namePrefix = "nvlink-clique-"
)

// The controller manages only HyperNodes labelled managed-by
// gpu-dra-controller (modelclasses.ManagedByLabel) that carry the clique
// label (vocabulary.LabelClique, the clique they stand for).
var managedSelector = modelclasses.ManagedByLabel + "=" + modelclasses.ManagedByValue + "," + vocabulary.LabelClique

var nonName = regexp.MustCompile(`[^a-z0-9.-]+`)

// Name is the name of a clique's HyperNode: nvlink-clique-<cliqueID> when
// that is a valid object name, else a lower-cased, cleaned-up ID with a hash
// of the exact ID (so that two IDs never share a name).
func Name(cliqueID string) string {
	name := namePrefix + cliqueID
	if len(validation.IsDNS1123Subdomain(name)) == 0 {
		return name
	}
	sum := sha256.Sum256([]byte(cliqueID))
	clean := strings.Trim(nonName.ReplaceAllString(strings.ToLower(cliqueID), "-"), ".-")
	return namePrefix + clean[:min(len(clean), 200)] + "-" + hex.EncodeToString(sum[:4])
}

// cliques groups the nodes by their clique label, each clique's node names
// sorted; nodes without the label are in none.
func cliques(nodes []*corev1.Node) map[string][]string {
	out := map[string][]string{}
	for _, n := range nodes {
		if c := n.Labels[vocabulary.LabelClique]; c != "" {
			out[c] = append(out[c], n.Name)
		}
	}
	for _, members := range out {
		slices.Sort(members)
	}
	return out
}

// desired is the HyperNode of a clique with the given (sorted) nodes.
func desired(cliqueID string, nodes []string) *unstructured.Unstructured {
	members := make([]any, 0, len(nodes))
	for _, n := range nodes {
		members = append(members, map[string]any{
			"type":     "Node",
			"selector": map[string]any{"exactMatch": map[string]any{"name": n}},
		})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Resource.GroupVersion().String(),
		"kind":       Kind,
		"metadata": map[string]any{
			"name": Name(cliqueID),
			"labels": map[string]any{
				modelclasses.ManagedByLabel: modelclasses.ManagedByValue,
				vocabulary.LabelClique:      cliqueID,
			},
		},
		"spec": map[string]any{
			"tier":     int64(Tier),
			"tierName": TierName,
			"members":  members,
		},
	}}
}

// upToDate reports whether the existing HyperNode has the spec and labels
// of want; other fields (status, other labels and annotations) are not the
// controller's.
func upToDate(have, want *unstructured.Unstructured) bool {
	for k, v := range want.GetLabels() {
		if have.GetLabels()[k] != v {
			return false
		}
	}
	// A number read back from the API server is an int64, as desired writes it.
	return reflect.DeepEqual(have.Object["spec"], want.Object["spec"])
}
