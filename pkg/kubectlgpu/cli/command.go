// Package cli is the command line of `kubectl gpu`: cobra commands over
// pkg/kubectlgpu with kubectl's kubeconfig, context and namespace flags
// (k8s.io/cli-runtime genericclioptions).
//
// It is a package of its own because genericclioptions links Go's plugin
// package, which makes a cgo binary bind every symbol at start; a test
// binary that also links the simulated NVML (lazily bound) would not start.
package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Options configure NewCommand.
type Options struct {
	Streams genericiooptions.IOStreams
	// Client, when set, is used instead of a client built from the
	// kubeconfig flags (tests, or a program embedding the commands).
	Client kubernetes.Interface
	// Dynamic, when set, replaces the dynamic client (ComputeDomains) built
	// from the kubeconfig flags.
	Dynamic dynamic.Interface
	// Metrics, when set, reads the plugins' metrics for `top` instead of
	// a port-forward through the API server (tests).
	Metrics kubectlgpu.MetricsReader
}

// NewCommand returns the kubectl-gpu command with its subcommands nodes,
// node and claims. It takes kubectl's kubeconfig, context and namespace
// flags, so KUBECONFIG, --context and -n work as in kubectl.
func NewCommand(opts Options) *cobra.Command {
	config := genericclioptions.NewConfigFlags(true)
	run := kubectlgpu.Options{Out: opts.Streams.Out, ErrOut: opts.Streams.ErrOut}
	client := func() (kubernetes.Interface, error) {
		if opts.Client != nil {
			return opts.Client, nil
		}
		return newClient(config)
	}
	cmd := &cobra.Command{
		Use:   "kubectl-gpu",
		Short: "Show the GPUs of a DRA driver, what is free and who holds what",
		Long: `kubectl gpu shows the GPUs the gpu.dra.dev DRA driver publishes in ResourceSlices,
how each is used (whole, MIG devices, time-slicing or MPS shares, passthrough to a
virtual machine) and which claims and pods hold them. It reads ResourceSlices,
ResourceClaims, DeviceClasses and Pods with one list per resource type.`,
		Annotations:       map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl gpu"},
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
		SilenceUsage:      true,
		SilenceErrors:     true,
		Args:              cobra.NoArgs,
		RunE:              func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		PersistentPreRunE: func(*cobra.Command, []string) error { return run.Validate() },
	}
	cmd.SetIn(opts.Streams.In)
	cmd.SetOut(opts.Streams.Out)
	cmd.SetErr(opts.Streams.ErrOut)
	flags := cmd.PersistentFlags()
	config.AddFlags(flags)
	flags.StringVar(&run.Driver, "driver", vocabulary.DriverName, "DRA driver name whose ResourceSlices to show")
	flags.StringVarP(&run.Output, "output", "o", "", "Output format: wide, json or yaml (default: a table)")

	cmd.AddCommand(&cobra.Command{
		Use:   "nodes",
		Short: "List nodes with their GPUs and how each GPU is used, with a cluster total",
		Example: `  kubectl gpu nodes
  kubectl gpu nodes -o wide
  kubectl gpu nodes -o json | jq .total`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			return kubectlgpu.RunNodes(cmd.Context(), c, run)
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "node NAME",
		Short: "Show one node's GPUs: identity, topology, holders and free MIG placements",
		Example: `  kubectl gpu node node-a
  kubectl gpu node node-a -o yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			return kubectlgpu.RunNode(cmd.Context(), c, run, args[0])
		},
	})
	cmd.AddCommand(claimsCommand(config, &run, client))
	cmd.AddCommand(domainsCommand(config, &run, func() (dynamic.Interface, error) {
		if opts.Dynamic != nil {
			return opts.Dynamic, nil
		}
		cfg, err := config.ToRESTConfig()
		if err != nil {
			return nil, fmt.Errorf("load kubeconfig: %w", err)
		}
		return dynamic.NewForConfig(cfg)
	}))
	cmd.AddCommand(topCommand(config, &run, client, opts.Metrics))
	return cmd
}

func topCommand(config *genericclioptions.ConfigFlags, run *kubectlgpu.Options, client func() (kubernetes.Interface, error), reader kubectlgpu.MetricsReader) *cobra.Command {
	var all bool
	var top kubectlgpu.TopOptions
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Show what each container uses of its GPUs, MIG devices and shares (SM, memory), like kubectl top pod",
		Long: `kubectl gpu top shows, per pod and container, the device it uses (whole GPU, MIG device,
time-slicing or MPS share), the share of the device's SMs its processes used since the
plugin's previous reading, and the device memory they hold out of the device's memory.
It reads each kubelet plugin's local metrics port through the API server's
pods/portforward (no Prometheus needed): the user needs list pods and create
pods/portforward in the driver's namespace (docs/kubectl-gpu.md).`,
		Example: `  kubectl gpu top
  kubectl gpu top -A --node node-a
  kubectl gpu top -n team-a -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !all {
				ns, _, err := config.ToRawKubeConfigLoader().Namespace()
				if err != nil {
					return fmt.Errorf("find the namespace (give -n NAMESPACE or -A): %w", err)
				}
				top.Namespace = ns
			}
			c, err := client()
			if err != nil {
				return err
			}
			top.Reader = reader
			if top.Reader == nil {
				cfg, err := config.ToRESTConfig()
				if err != nil {
					return fmt.Errorf("load kubeconfig: %w", err)
				}
				top.Reader = portForwarder{config: cfg, client: c}
			}
			return kubectlgpu.RunTop(cmd.Context(), c, *run, top)
		},
	}
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "Show containers in all namespaces, and processes in no known pod")
	cmd.Flags().StringVar(&top.Node, "node", "", "Show only this node")
	cmd.Flags().StringVar(&top.PluginNamespace, "plugin-namespace", "", "Namespace of the kubelet plugin pods (default: any; give it when you may list pods only there)")
	return cmd
}

func claimsCommand(config *genericclioptions.ConfigFlags, run *kubectlgpu.Options, client func() (kubernetes.Interface, error)) *cobra.Command {
	return namespacedCommand(config, &cobra.Command{
		Use:   "claims",
		Short: "List the driver's claims: pods, node, devices (whole, MIG profile, share, passthrough) and sharing config",
		Example: `  kubectl gpu claims
  kubectl gpu claims -n team-a
  kubectl gpu claims -A -o wide`,
	}, "claims", func(ctx context.Context, namespace string) error {
		c, err := client()
		if err != nil {
			return err
		}
		return kubectlgpu.RunClaims(ctx, c, *run, namespace)
	})
}

func domainsCommand(config *genericclioptions.ConfigFlags, run *kubectlgpu.Options, client func() (dynamic.Interface, error)) *cobra.Command {
	return namespacedCommand(config, &cobra.Command{
		Use:   "domains",
		Short: "List ComputeDomains: Ready and reason, clique, nodes, each node's IMEX daemon state and unreachable peers",
		Example: `  kubectl gpu domains
  kubectl gpu domains -A -o wide
  kubectl gpu domains -n team-a -o yaml`,
	}, "domains", func(ctx context.Context, namespace string) error {
		c, err := client()
		if err != nil {
			return err
		}
		return kubectlgpu.RunDomains(ctx, c, *run, namespace)
	})
}

// namespacedCommand completes cmd as a list of one namespace (-n, or the
// kubeconfig's) or of all (-A) that run lists.
func namespacedCommand(config *genericclioptions.ConfigFlags, cmd *cobra.Command, what string, run func(ctx context.Context, namespace string) error) *cobra.Command {
	var all bool
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		namespace, err := namespaceOf(config, all)
		if err != nil {
			return err
		}
		return run(cmd.Context(), namespace)
	}
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "List "+what+" in all namespaces")
	return cmd
}

// namespaceOf is the namespace -n or the kubeconfig names; "" with -A.
func namespaceOf(config *genericclioptions.ConfigFlags, all bool) (string, error) {
	if all {
		return "", nil
	}
	ns, _, err := config.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", fmt.Errorf("find the namespace (give -n NAMESPACE or -A): %w", err)
	}
	return ns, nil
}

func newClient(config *genericclioptions.ConfigFlags) (kubernetes.Interface, error) {
	cfg, err := config.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	// A few large lists: protobuf decodes them several times faster than
	// JSON, and client-go's default of 5 QPS would only slow paging.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create client: %w", err)
	}
	return client, nil
}
