package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// computeDomainFile is the demo's multi-node NVLink job.
const computeDomainFile = "demo/computedomain/training.yaml"

// computeDomainPart runs a ComputeDomain's two workers over the GB200 trays
// (hack/demo/lib.sh): both land in one NVLink clique, share one IMEX channel,
// and the domain turns Ready when their trays' IMEX daemons are connected;
// when the workers go, so does the AfterLastPod domain. It is skipped, saying
// why, without a clique of two trays.
func computeDomainPart(ctx context.Context, r *scenarios.Runner) (res outcome) {
	start := time.Now()
	res = outcome{name: "compute-domain", title: "compute-domain: two workers over two NVL72 trays of one clique, one IMEX channel, daemons connected"}
	defer func() { res.took = time.Since(start) }()
	fmt.Printf("\n=== %s\n", res.title)
	cliques, err := trayCliques(ctx, r)
	if err != nil {
		res.err = err
		return res
	}
	rack := cliqueOf2(cliques)
	if rack == "" {
		fmt.Printf("  skipped: no NVLink clique of two trays (nodes labelled %s: %v; make demo starts them, GDD_NODES=6)\n", vocabulary.LabelClique, cliques)
		res.title += " (skipped)"
		return res
	}
	for c, nodes := range cliques {
		fmt.Printf("  clique %s: %s\n", c, strings.Join(nodes, ", "))
	}
	// The demo cordons all nodes but the first outside the fleet parts.
	if res.err = r.SetUnschedulable(ctx, false, cliques[rack]...); res.err != nil {
		return res
	}
	defer func() {
		if err := r.SetUnschedulable(context.WithoutCancel(ctx), true, cliques[rack]...); err != nil && res.err == nil {
			res.err = err
		}
	}()
	if res.err = applyFile(ctx, r, computeDomainFile, "CLIQUE", rack); res.err != nil {
		return res
	}
	const ns, domain = "demo-compute-domain", "train"
	defer func() {
		if err := r.DeleteNamespaces(context.WithoutCancel(ctx), ns); err != nil && res.err == nil {
			res.err = err
		}
	}()
	fmt.Printf("  kubectl apply -f %s (ComputeDomain %s; 2 workers x 4 GPUs + the domain's channel, in clique %s)\n", computeDomainFile, domain, rack)

	var cd *gpuv1beta1.ComputeDomain
	err = wait.PollUntilContextTimeout(ctx, time.Second, r.Timeout, true, func(ctx context.Context) (bool, error) {
		got, err := getComputeDomain(ctx, r, ns, domain)
		if err != nil {
			return false, nil
		}
		cd = got
		connected := 0
		for _, n := range cd.Status.Nodes {
			if n.Daemon.State == gpuv1beta1.DaemonConnected {
				connected++
			}
		}
		return connected == 2 && readyCondition(cd) == metav1.ConditionTrue, nil
	})
	if err != nil {
		res.err = fmt.Errorf("ComputeDomain %s not Ready on two nodes: status %+v: %w", domain, cd, err)
		return res
	}
	pods, err := r.Cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=train"})
	if err != nil {
		res.err = err
		return res
	}
	for _, p := range pods.Items {
		fmt.Printf("  %-16s %s on %s (clique %s)\n", p.Name, p.Status.Phase, p.Spec.NodeName, cliqueOf(cliques, p.Spec.NodeName))
		if p.Status.Phase != corev1.PodRunning {
			res.problems = append(res.problems, fmt.Sprintf("%s is %s", p.Name, p.Status.Phase))
		}
	}
	for _, n := range cd.Status.Nodes {
		fmt.Printf("  domain node %-12s %s channel %d daemon %s\n", n.Name, n.IPAddress, derefChannel(n.Channel), n.Daemon.State)
	}
	fmt.Printf("  ComputeDomain %s: Ready\n", domain)
	if r.KubectlGPUPath != "" {
		if out, err := r.KubectlGPU(ctx, "domains", "-n", ns); err == nil {
			fmt.Printf("  $ kubectl gpu domains -n %s\n%s", ns, indent(out))
		} else {
			res.problems = append(res.problems, fmt.Sprintf("kubectl gpu domains: %v", err))
		}
	}

	// The workers end: the AfterLastPod domain and its channel claim follow.
	if err := r.Cluster.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "app=train"}); err != nil {
		res.err = err
		return res
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, r.Timeout, true, func(ctx context.Context) (bool, error) {
		_, err := getComputeDomain(ctx, r, ns, domain)
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		res.err = fmt.Errorf("AfterLastPod domain %s still there after its workers were deleted: %w", domain, err)
		return res
	}
	fmt.Printf("  workers deleted: the domain's daemons stopped and the AfterLastPod domain is gone\n")
	return res
}

// trayCliques maps each NVLink clique to its nodes, by the controller's label.
func trayCliques(ctx context.Context, r *scenarios.Runner) (map[string][]string, error) {
	nodes, err := r.Cluster.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: vocabulary.LabelClique})
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, n := range nodes.Items {
		c := n.Labels[vocabulary.LabelClique]
		out[c] = append(out[c], n.Name)
	}
	return out, nil
}

// cliqueOf2 returns a clique of two or more nodes, "" if there is none.
func cliqueOf2(cliques map[string][]string) string {
	for c, nodes := range cliques {
		if len(nodes) >= 2 {
			return c
		}
	}
	return ""
}

func cliqueOf(cliques map[string][]string, node string) string {
	for c, nodes := range cliques {
		for _, n := range nodes {
			if n == node {
				return c
			}
		}
	}
	return "none"
}

func getComputeDomain(ctx context.Context, r *scenarios.Runner, ns, name string) (*gpuv1beta1.ComputeDomain, error) {
	u, err := r.Cluster.Dynamic.Resource(gpuv1beta1.ComputeDomainResource).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var cd gpuv1beta1.ComputeDomain
	return &cd, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cd)
}

func readyCondition(cd *gpuv1beta1.ComputeDomain) metav1.ConditionStatus {
	for _, c := range cd.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status
		}
	}
	return metav1.ConditionUnknown
}

func derefChannel(c *int32) int32 {
	if c == nil {
		return -1
	}
	return *c
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("    " + l + "\n")
	}
	return b.String()
}

// applyFile applies every object of a YAML file, with each old string of
// replace (old, new pairs) replaced first.
func applyFile(ctx context.Context, r *scenarios.Runner, path string, replace ...string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	data = []byte(strings.NewReplacer(replace...).Replace(string(data)))
	objs, err := scenarios.DecodeObjects(data)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if err := r.Cluster.Apply(ctx, o); err != nil {
			return fmt.Errorf("apply %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return nil
}
