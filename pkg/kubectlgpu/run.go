package kubectlgpu

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"k8s.io/client-go/kubernetes"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Options are what every command needs besides its arguments.
type Options struct {
	// Driver is the DRA driver name; vocabulary.DriverName when empty.
	Driver string
	// Output is OutputTable, OutputWide, OutputJSON or OutputYAML.
	Output string
	// Out receives the report, ErrOut warnings and notes.
	Out, ErrOut io.Writer
}

// Validate checks the output format.
func (o *Options) Validate() error {
	if o.Output != OutputTable && !slices.Contains(outputFormats, o.Output) {
		return fmt.Errorf("unknown output format %q for -o (supported: %s)", o.Output, strings.Join(outputFormats, ", "))
	}
	return nil
}

func (o *Options) driver() string {
	if o.Driver == "" {
		return vocabulary.DriverName
	}
	return o.Driver
}

func (o *Options) structured() bool { return o.Output == OutputJSON || o.Output == OutputYAML }

// RunNodes is `kubectl gpu nodes`: every node with GPUs of the driver, how
// each GPU is used, and a cluster total.
func RunNodes(ctx context.Context, client kubernetes.Interface, o Options) error {
	inv, err := load(ctx, client, &o, Scope{})
	if err != nil {
		return err
	}
	list := inv.NodeList()
	if o.structured() {
		return printObject(o.Out, list, o.Output)
	}
	return PrintNodes(o.Out, list, o.Output == OutputWide)
}

// RunNode is `kubectl gpu node NAME`: one node's GPUs with their identity,
// holders and free MIG placements.
func RunNode(ctx context.Context, client kubernetes.Interface, o Options, name string) error {
	inv, err := load(ctx, client, &o, Scope{Node: name, Pods: true})
	if err != nil {
		return err
	}
	detail, err := inv.NodeDetail(name)
	if err != nil {
		return err
	}
	if o.structured() {
		return printObject(o.Out, detail, o.Output)
	}
	return PrintNode(o.Out, detail, o.Output == OutputWide)
}

// RunClaims is `kubectl gpu claims`: the claims of namespace ("" for all)
// that use the driver, with their pods, node, devices and config.
func RunClaims(ctx context.Context, client kubernetes.Interface, o Options, namespace string) error {
	inv, err := load(ctx, client, &o, Scope{Namespace: namespace, Classes: true, Pods: true})
	if err != nil {
		return err
	}
	list := inv.ClaimList(namespace)
	if o.structured() {
		return printObject(o.Out, list, o.Output)
	}
	if len(list.Claims) == 0 {
		fmt.Fprintf(o.ErrOut, "No claims for %s devices found %s.\n", inv.Driver, inNamespace(namespace))
		return nil
	}
	return PrintClaims(o.Out, list, o.Output == OutputWide)
}

// inNamespace says where a namespaced list looked ("" is all).
func inNamespace(namespace string) string {
	if namespace == "" {
		return "in any namespace"
	}
	return fmt.Sprintf("in namespace %q", namespace)
}

// load fetches what scope needs and builds the inventory; it fails with a
// clear message when the driver publishes nothing at all.
func load(ctx context.Context, client kubernetes.Interface, o *Options, scope Scope) (*Inventory, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.ErrOut == nil {
		o.ErrOut = io.Discard
	}
	scope.Driver = o.driver()
	inv, warnings, err := Load(ctx, client, scope)
	if err != nil {
		return nil, err
	}
	for _, w := range warnings {
		fmt.Fprintf(o.ErrOut, "Warning: %s\n", w)
	}
	if inv.slices == 0 && scope.Node == "" {
		return nil, fmt.Errorf("the %s driver is not installed or publishes no GPUs (no ResourceSlices with spec.driver=%s)", scope.Driver, scope.Driver)
	}
	return inv, nil
}
