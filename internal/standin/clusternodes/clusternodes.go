// Package clusternodes stands in for GPU nodes joined to a real cluster, with
// no kubelet or machine behind them: Node objects reported Ready, their
// Leases renewed, and the ResourceSlices that
// `dra-kubelet-plugin --simulate <machine> --print-slices` prints. The
// scheduler allocates claims on them and binds pods to them (which never
// run); the controller labels them and makes classes for their models.
// Follow makes their slices follow the claims allocated on them, through
// the plugin's own publication path.
package clusternodes

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"
)

// placeholder is the node name given to --print-slices, replaced per node.
const placeholder = "FAKE-NODE-NAME"

// PrintSlices runs plugin --print-slices once for a simulated machine (and a
// device policy, when not empty) and returns a function that gives the
// slices for a node name.
func PrintSlices(ctx context.Context, plugin, machine, policy string) (func(node string) []*resourceapi.ResourceSlice, error) {
	args := []string{"--simulate=" + machine, "--node-name=" + placeholder, "--print-slices"}
	if policy != "" {
		f, err := os.CreateTemp("", "clusternodes-policy-*.yaml")
		if err != nil {
			return nil, err
		}
		defer func() { _ = os.Remove(f.Name()) }()
		if _, err := f.WriteString(policy); err != nil {
			return nil, err
		}
		if err := f.Close(); err != nil {
			return nil, err
		}
		args = append(args, "--device-policy="+f.Name())
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, plugin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s --print-slices: %w: %s", plugin, err, stderr.String())
	}
	if _, err := parseSlices(out); err != nil {
		return nil, fmt.Errorf("%s --print-slices: %w", plugin, err)
	}
	return func(node string) []*resourceapi.ResourceSlice {
		slices, _ := parseSlices(bytes.ReplaceAll(out, []byte(placeholder), []byte(node)))
		return slices
	}, nil
}

// parseSlices reads a YAML stream of ResourceSlices.
func parseSlices(data []byte) ([]*resourceapi.ResourceSlice, error) {
	var res []*resourceapi.ResourceSlice
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return res, nil
		}
		if err != nil {
			return nil, err
		}
		s := &resourceapi.ResourceSlice{}
		if err := yaml.Unmarshal(doc, s); err != nil {
			return nil, err
		}
		if s.Spec.Driver != "" {
			res = append(res, s)
		}
	}
}

// Add creates the Node name, Ready and with room for many pods, carrying
// labels (and kubernetes.io/hostname), its Lease, then its slices, which
// get the same labels and the Node as owner.
func Add(ctx context.Context, client kubernetes.Interface, name string, labels map[string]string, slices []*resourceapi.ResourceSlice) error {
	nodeLabels := map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
	maps.Copy(nodeLabels, labels)
	node, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: nodeLabels}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err = client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		node.Status = corev1.NodeStatus{
			Capacity: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("224"), corev1.ResourceMemory: resource.MustParse("2Ti"), corev1.ResourcePods: resource.MustParse("250"),
			},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				Message: "simulated, no kubelet (internal/standin/clusternodes)", LastHeartbeatTime: now, LastTransitionTime: now}},
		}
		node.Status.Allocatable = node.Status.Capacity
		_, err = client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("node %s status: %w", name, err)
	}
	// The node lifecycle controller's grace period starts now; RenewLeases
	// keeps the Lease fresh after.
	if err := createLease(ctx, client, name); err != nil {
		return err
	}
	for _, s := range slices {
		s.Labels = maps.Clone(labels)
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: name, UID: node.UID}}
		if _, err := client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create a ResourceSlice of node %s: %w", name, err)
		}
	}
	return nil
}

// Remove deletes the ResourceSlices that sliceSelector (a label selector)
// selects, then the nodes, their own slices (those Follow publishes carry
// no labels) and their Leases. What is already gone is no error.
func Remove(ctx context.Context, client kubernetes.Interface, sliceSelector string, nodes []string) error {
	var errs []error
	notFound := func(err error) error {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	if err := client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sliceSelector}); err != nil {
		errs = append(errs, fmt.Errorf("delete ResourceSlices %s: %w", sliceSelector, err))
	}
	for _, n := range nodes {
		if err := notFound(client.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})); err != nil {
			errs = append(errs, fmt.Errorf("delete node %s: %w", n, err))
		}
		onNode := fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, n).String()
		if err := client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: onNode}); err != nil {
			errs = append(errs, fmt.Errorf("delete ResourceSlices of node %s: %w", n, err))
		}
		if err := notFound(client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, n, metav1.DeleteOptions{})); err != nil {
			errs = append(errs, fmt.Errorf("delete lease of node %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}
