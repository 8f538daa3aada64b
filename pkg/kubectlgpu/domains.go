package kubectlgpu

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

// DomainList is `kubectl gpu domains`: the ComputeDomains of a namespace
// (or all).
type DomainList struct {
	Domains []Domain `json:"domains"`
}

// Domain is one ComputeDomain as the controller and the nodes report it.
type Domain struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Claim is the shared channel claim the pods reference, Template the
	// claim template they reference instead (template mode).
	Claim    string `json:"claim"`
	Template string `json:"template,omitempty"`
	// Channel is the channel number the controller reserved for it.
	Channel *int32 `json:"channel,omitempty"`
	// Cliques are the cliques its nodes report (one, unless something is
	// wrong).
	Cliques []string `json:"cliques,omitempty"`
	// Ready is the Ready condition's status ("Unknown" before the
	// controller wrote one), Reason and Message its reason and message.
	Ready   string       `json:"ready"`
	Reason  string       `json:"reason,omitempty"`
	Message string       `json:"message,omitempty"`
	Nodes   []DomainNode `json:"nodes,omitempty"`
}

// DomainNode is a node's entry in the domain's status.
type DomainNode struct {
	Name             string   `json:"name"`
	CliqueID         string   `json:"cliqueID,omitempty"`
	Channel          *int32   `json:"channel,omitempty"`
	Daemon           string   `json:"daemon"`
	UnreachablePeers []string `json:"unreachablePeers,omitempty"`
	Message          string   `json:"message,omitempty"`
}

// RunDomains is `kubectl gpu domains`: the ComputeDomains of namespace
// ("" for all) with their clique, nodes, each node's IMEX daemon state and
// unreachable peers, and Ready with its reason.
func RunDomains(ctx context.Context, client dynamic.Interface, o Options, namespace string) error {
	if err := o.Validate(); err != nil {
		return err
	}
	list, err := LoadDomains(ctx, client, namespace)
	if err != nil {
		return err
	}
	if o.structured() {
		return printObject(o.Out, list, o.Output)
	}
	if len(list.Domains) == 0 {
		if o.ErrOut != nil {
			fmt.Fprintf(o.ErrOut, "No ComputeDomains found %s.\n", inNamespace(namespace))
		}
		return nil
	}
	return PrintDomains(o.Out, list, o.Output == OutputWide)
}

// LoadDomains lists the ComputeDomains of namespace ("" for all), a page
// of 500 at a time, sorted by namespace and name.
func LoadDomains(ctx context.Context, client dynamic.Interface, namespace string) (DomainList, error) {
	var out DomainList
	opts := metav1.ListOptions{Limit: 500}
	for {
		page, err := client.Resource(gpuv1beta1.ComputeDomainResource).Namespace(namespace).List(ctx, opts)
		if err != nil {
			return out, fmt.Errorf("list ComputeDomains: %w", err)
		}
		for i := range page.Items {
			var cd gpuv1beta1.ComputeDomain
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(page.Items[i].Object, &cd); err != nil {
				return out, fmt.Errorf("ComputeDomain %s/%s: %w", page.Items[i].GetNamespace(), page.Items[i].GetName(), err)
			}
			out.Domains = append(out.Domains, domainOf(&cd))
		}
		if opts.Continue = page.GetContinue(); opts.Continue == "" {
			break
		}
	}
	slices.SortFunc(out.Domains, func(a, b Domain) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out, nil
}

func domainOf(cd *gpuv1beta1.ComputeDomain) Domain {
	d := Domain{Namespace: cd.Namespace, Name: cd.Name, Claim: cd.Spec.Channel.ResourceClaimName,
		Template: cd.Spec.Channel.ResourceClaimTemplateName, Channel: cd.Status.Channel, Ready: string(metav1.ConditionUnknown)}
	if c := meta.FindStatusCondition(cd.Status.Conditions, "Ready"); c != nil {
		d.Ready, d.Reason, d.Message = string(c.Status), c.Reason, c.Message
	}
	for _, n := range cd.Status.Nodes {
		d.Nodes = append(d.Nodes, DomainNode{
			Name: n.Name, CliqueID: n.CliqueID, Channel: n.Channel, Daemon: string(n.Daemon.State),
			UnreachablePeers: n.Daemon.UnreachablePeers, Message: n.Daemon.Message,
		})
		if n.CliqueID != "" && !slices.Contains(d.Cliques, n.CliqueID) {
			d.Cliques = append(d.Cliques, n.CliqueID)
		}
	}
	slices.SortFunc(d.Nodes, func(a, b DomainNode) int { return cmp.Compare(a.Name, b.Name) })
	slices.Sort(d.Cliques)
	return d
}

// PrintDomains writes one row per node of each domain (a domain without
// nodes gets one row), the domain's columns on its first row only. Wide
// adds each node's channel and daemon message, the claim (template/<name>
// in template mode) and the Ready message.
func PrintDomains(w io.Writer, list DomainList, wide bool) error {
	tw := newTable(w)
	header := []string{"NAMESPACE", "DOMAIN", "READY", "REASON", "CLIQUE", "NODE", "DAEMON", "UNREACHABLE"}
	if wide {
		header = append(header, "CHANNEL", "DAEMON-MESSAGE", "CLAIM", "MESSAGE")
	}
	row(tw, header...)
	for _, d := range list.Domains {
		first := []string{d.Namespace, d.Name, d.Ready, orDash(d.Reason), orDash(strings.Join(d.Cliques, ","))}
		blank := []string{"", "", "", "", ""}
		nodes := d.Nodes
		if len(nodes) == 0 {
			nodes = []DomainNode{{Name: "-", Daemon: "-"}}
		}
		for i, n := range nodes {
			cells := blank
			if i == 0 {
				cells = first
			}
			cells = append(slices.Clone(cells), n.Name, n.Daemon, orDash(strings.Join(n.UnreachablePeers, ",")))
			if wide {
				channel := "-"
				if n.Channel != nil {
					channel = strconv.Itoa(int(*n.Channel))
				}
				claim, msg := "", ""
				if i == 0 {
					claim, msg = d.Claim, orDash(d.Message)
					if d.Template != "" {
						claim = "template/" + d.Template
					}
				}
				cells = append(cells, channel, orDash(n.Message), claim, msg)
			}
			row(tw, cells...)
		}
	}
	return tw.Flush()
}
