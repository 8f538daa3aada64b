package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
)

// volcanoJobFile is the guide's Volcano gang Job, as its users write it.
const volcanoJobFile = "demo/volcano/tensorflow-job.yaml"

// volcanoPart runs the Volcano gang Job of the GPU guide this driver replaces
// verbatim (4 pods x nvidia.com/gpu: 2, minAvailable 4) on vc-scheduler
// (hack/volcano/up.sh) and prints its pods starting together. Where Volcano
// could not start (no ../shared/volcano) it says so and why.
func volcanoPart(ctx context.Context, r *scenarios.Runner, opts options) (res outcome) {
	start := time.Now()
	res = outcome{name: "volcano", title: "volcano: the guide's gang Job (4 pods x nvidia.com/gpu: 2) as written, all 4 start together"}
	defer func() { res.took = time.Since(start) }()
	fmt.Printf("\n=== %s\n", res.title)
	if opts.volcanoSkip != "" {
		fmt.Printf("  skipped: %s\n", opts.volcanoSkip)
		res.title += " (skipped)"
		return res
	}
	if err := applyFile(ctx, r, volcanoJobFile); err != nil {
		res.err = err
		return res
	}
	const ns, job, want = "demo-volcano", "tensorflow-job", 4
	defer func() {
		if err := r.DeleteNamespaces(context.WithoutCancel(ctx), ns); err != nil && res.err == nil {
			res.err = err
		}
	}()
	fmt.Printf("  kubectl apply -f %s (schedulerName: volcano, limits nvidia.com/gpu: 2, no ResourceClaim)\n", volcanoJobFile)
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, time.Second, r.Timeout, true, func(ctx context.Context) (bool, error) {
		list, err := r.Cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "volcano.sh/job-name=" + job})
		if err != nil {
			return false, nil
		}
		pods = list.Items
		running := 0
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == want, nil
	})
	if err != nil {
		res.err = fmt.Errorf("%d pods of %s, want %d Running: %w", len(pods), job, want, err)
		return res
	}
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return a.Status.StartTime.Compare(b.Status.StartTime.Time) })
	first := pods[0].Status.StartTime.Time
	for _, p := range pods {
		claim := "-"
		if len(p.Status.ResourceClaimStatuses) > 0 && p.Status.ResourceClaimStatuses[0].ResourceClaimName != nil {
			claim = *p.Status.ResourceClaimStatuses[0].ResourceClaimName
		}
		fmt.Printf("  %-22s Running on %-12s started +%-4s claim %s\n", p.Name, p.Spec.NodeName,
			p.Status.StartTime.Sub(first).Round(time.Second), claim)
	}
	fmt.Printf("  all %d pods of the gang started within %s\n", want, pods[len(pods)-1].Status.StartTime.Sub(first).Round(time.Second))
	return res
}
