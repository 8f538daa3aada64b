package kubectlgpu

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
)

// DefaultDriver is the driver name the commands look at unless --driver says
// otherwise.
const DefaultDriver = "gpu.dra.dev"

// CommandOptions configure NewCommand.
type CommandOptions struct {
	Streams genericiooptions.IOStreams
	// Client, when set, is used instead of a client built from the
	// kubeconfig flags (tests, or a program embedding the commands).
	Client kubernetes.Interface
}

// options are the flags shared by every command.
type options struct {
	streams genericiooptions.IOStreams
	config  *genericclioptions.ConfigFlags
	client  kubernetes.Interface
	driver  string
	output  string
}

// NewCommand returns the kubectl-gpu command with its subcommands nodes,
// node and claims. It takes the kubeconfig, context and namespace flags of
// kubectl (k8s.io/cli-runtime), so KUBECONFIG, --context and -n work as in
// kubectl.
func NewCommand(co CommandOptions) *cobra.Command {
	o := &options{streams: co.Streams, client: co.Client, config: genericclioptions.NewConfigFlags(true)}
	cmd := &cobra.Command{
		Use:   "kubectl-gpu",
		Short: "Show the GPUs of a DRA driver, what is free and who holds what",
		Long: `kubectl gpu shows the GPUs the gpu.dra.dev DRA driver publishes in ResourceSlices,
how each is used (whole, MIG devices, time-slicing or MPS shares) and which claims
and pods hold them. It reads ResourceSlices, ResourceClaims, DeviceClasses and Pods
with one list per resource type.`,
		Annotations: map[string]string{
			cobra.CommandDisplayNameAnnotation: "kubectl gpu",
		},
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
		SilenceUsage:      true,
		SilenceErrors:     true,
		Args:              cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if o.output != OutputTable && !slices.Contains(outputFormats, o.output) {
				return fmt.Errorf("unknown output format %q for -o (supported: %s)", o.output, strings.Join(outputFormats, ", "))
			}
			return nil
		},
	}
	cmd.SetIn(co.Streams.In)
	cmd.SetOut(co.Streams.Out)
	cmd.SetErr(co.Streams.ErrOut)
	flags := cmd.PersistentFlags()
	o.config.AddFlags(flags)
	flags.StringVar(&o.driver, "driver", DefaultDriver, "DRA driver name whose ResourceSlices to show")
	flags.StringVarP(&o.output, "output", "o", "", "Output format: wide, json or yaml (default: table)")
	cmd.AddCommand(o.nodesCommand(), o.nodeCommand(), o.claimsCommand())
	return cmd
}

func (o *options) nodesCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "List nodes with their GPUs and how each GPU is used, with a cluster total",
		Example: `  kubectl gpu nodes
  kubectl gpu nodes -o wide
  kubectl gpu nodes -o json | jq '.total'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			inv, err := o.load(cmd.Context(), Scope{})
			if err != nil {
				return err
			}
			list := inv.NodeList()
			if o.output == OutputJSON || o.output == OutputYAML {
				return printObject(o.streams.Out, list, o.output)
			}
			return PrintNodes(o.streams.Out, list, o.output == OutputWide)
		},
	}
}

func (o *options) nodeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "node NAME",
		Short: "Show one node's GPUs: identity, topology, holders and free MIG placements",
		Example: `  kubectl gpu node node-a
  kubectl gpu node node-a -o yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			inv, err := o.load(cmd.Context(), Scope{Node: args[0], Pods: true})
			if err != nil {
				return err
			}
			detail, err := inv.NodeDetail(args[0])
			if err != nil {
				return err
			}
			if o.output == OutputJSON || o.output == OutputYAML {
				return printObject(o.streams.Out, detail, o.output)
			}
			return PrintNode(o.streams.Out, detail, o.output == OutputWide)
		},
	}
}

func (o *options) claimsCommand() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "claims",
		Short: "List claims of the driver: pods, node, devices (whole, MIG profile, share) and sharing config",
		Example: `  kubectl gpu claims
  kubectl gpu claims -n team-a
  kubectl gpu claims -A -o wide`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			namespace := ""
			if !all {
				ns, _, err := o.config.ToRawKubeConfigLoader().Namespace()
				if err != nil {
					return fmt.Errorf("find the namespace (give -n NAMESPACE or -A): %w", err)
				}
				namespace = ns
			}
			inv, err := o.load(cmd.Context(), Scope{Namespace: namespace, Classes: true, Pods: true})
			if err != nil {
				return err
			}
			list := inv.ClaimList(namespace)
			if o.output == OutputJSON || o.output == OutputYAML {
				return printObject(o.streams.Out, list, o.output)
			}
			if len(list.Claims) == 0 {
				where := "in namespace " + namespace
				if namespace == "" {
					where = "in any namespace"
				}
				fmt.Fprintf(o.streams.ErrOut, "No claims for %s devices found %s.\n", o.driver, where)
				return nil
			}
			return PrintClaims(o.streams.Out, list, o.output == OutputWide)
		},
	}
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "List claims in all namespaces")
	return cmd
}

// load fetches what scope needs and builds the inventory; it fails with
// a clear message when the driver publishes nothing.
func (o *options) load(ctx context.Context, scope Scope) (*Inventory, error) {
	client, err := o.kubeClient()
	if err != nil {
		return nil, err
	}
	scope.Driver = o.driver
	src, err := Fetch(ctx, client, scope)
	if err != nil {
		return nil, err
	}
	for _, w := range src.Warnings {
		fmt.Fprintf(o.streams.ErrOut, "Warning: %s\n", w)
	}
	if len(src.Slices) == 0 && scope.Node == "" {
		return nil, fmt.Errorf("the %s driver is not installed or publishes no GPUs (no ResourceSlices with spec.driver=%s)", o.driver, o.driver)
	}
	return Build(o.driver, src), nil
}

func (o *options) kubeClient() (kubernetes.Interface, error) {
	if o.client != nil {
		return o.client, nil
	}
	cfg, err := o.config.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	// A few large lists: protobuf decodes them several times faster than
	// JSON, and the default 5 QPS would only slow paging.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create client: %w", err)
	}
	return client, nil
}
