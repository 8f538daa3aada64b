// Command bench measures the driver on the local cluster (hack/demo/bench-cluster.sh sets it
// up):
//
//   - start latency: 50 pods, each with a one-GPU claim from a template, created one
//     after the other on the real node with the real plugin; time from create to
//     Running and Ready, split at the scheduler's bind;
//   - scheduler throughput: 200 pods with one-GPU claims, created at once, against
//     extra simulated nodes (internal/standin/clusternodes: Node objects, their Leases renewed, and
//     the slices that `dra-kubelet-plugin --simulate --print-slices` prints), once for nodes publishing
//     the full device model (whole GPUs, MIG placements, shares, counters) and once for
//     nodes publishing whole GPUs only; time from the first create to the last bind;
//   - scheduler under churn (-churn-nodes): per model, simulated nodes whose slices follow
//     what is allocated on them (clusternodes.Follow: the plugin's publication path, with
//     withdrawal, and the reserve policy for reserve-k1), one-GPU pods until the GPUs are
//     -fill taken, then pods deleted and replaced; pods/s and kube-scheduler CPU per pod
//     (/proc/<pid>/stat), each -churn-models model ÷ the whole-GPU-only model (churn.go).
//
// Nodes without a kubelet never run the pods: throughput measures scheduling
// (allocation and binding) only.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/clusternodes"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const (
	benchLabel = "bench.gpu.dra.dev/model"
	image      = "gdd.local/demo:v1"
)

type config struct {
	plugin, machine string
	latencyPods     int
	throughputPods  int
	nodes           int
	kubeconfig      string
	skipLatency     bool
	skipThroughput  bool
	rounds          int

	churnNodes, churnPods, churnRounds, backlog int
	churnModels                                 string
	fill                                        float64
	schedulerPID                                int
	controlPlanePIDs                            string
	schedulerURL, profile, benchProfile         string
	apiserverProfile                            string
	profileSeconds                              int
}

func main() {
	var cfg config
	flag.StringVar(&cfg.plugin, "plugin", "bin/dra-kubelet-plugin", "dra-kubelet-plugin binary, for --print-slices.")
	flag.StringVar(&cfg.machine, "machine", "dgxh100", "Simulated machine of the extra nodes.")
	flag.IntVar(&cfg.latencyPods, "latency-pods", 50, "Pods for the start latency.")
	flag.IntVar(&cfg.throughputPods, "throughput-pods", 200, "Pods per scheduler throughput run.")
	flag.IntVar(&cfg.nodes, "nodes", 25, "Extra simulated nodes per model (8 GPUs each).")
	flag.StringVar(&cfg.kubeconfig, "kubeconfig", "", "Kubeconfig (default $KUBECONFIG, else the local cluster's).")
	flag.BoolVar(&cfg.skipLatency, "skip-latency", false, "Skip the start latency.")
	flag.BoolVar(&cfg.skipThroughput, "skip-throughput", false, "Skip the scheduler throughput.")
	flag.IntVar(&cfg.rounds, "rounds", 2, "Throughput rounds; each runs both models, alternating which goes first.")
	flag.IntVar(&cfg.churnNodes, "churn-nodes", 0, "Simulated nodes per model for the scheduler under churn; 0 skips it.")
	flag.Float64Var(&cfg.fill, "fill", 0.75, "Share of the churn nodes' GPUs that pods take before the churn.")
	flag.IntVar(&cfg.churnPods, "churn-pods", 400, "Pods deleted and replaced per model and round once filled.")
	flag.IntVar(&cfg.churnRounds, "churn-rounds", 2, "Churn rounds; each runs both models, alternating which goes first.")
	flag.StringVar(&cfg.churnModels, "churn-models", "full,reserve-k1", "Models compared with whole-gpu under churn: full (the default policy), reserve-k1 (the default policy with reserve: {spareGPUs: 1}).")
	flag.IntVar(&cfg.backlog, "backlog", 50, "Most pods waiting to be bound during the churn.")
	flag.IntVar(&cfg.schedulerPID, "scheduler-pid", 0, "PID of kube-scheduler, whose CPU the churn measures.")
	flag.StringVar(&cfg.controlPlanePIDs, "control-plane-pids", "", "name=PID,... of the other control-plane processes (kube-apiserver, etcd) whose CPU per pod the churn prints beside the scheduler's.")
	flag.StringVar(&cfg.schedulerURL, "scheduler-url", "https://127.0.0.1:10259", "kube-scheduler's secure port, for its metrics and CPU profile.")
	flag.StringVar(&cfg.profile, "profile", "", "Write a kube-scheduler CPU profile of the full model's last churn here.")
	flag.IntVar(&cfg.profileSeconds, "profile-seconds", 10, "Length of that profile.")
	flag.StringVar(&cfg.apiserverProfile, "apiserver-profile", "", "Write a kube-apiserver CPU profile of the full model's last churn (as long as -profile-seconds) here.")
	flag.StringVar(&cfg.benchProfile, "bench-profile", "", "Write a CPU profile of this process (the stand-in nodes' publishers) over the full model's last churn here.")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	cluster, err := scenarios.Connect(cfg.kubeconfig)
	if err != nil {
		return err
	}
	cluster.Config.QPS, cluster.Config.Burst = 500, 1000
	client, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		return err
	}
	b := &bench{client: client, cluster: cluster, runner: scenarios.NewRunner(cluster)}
	if !cfg.skipLatency {
		if err := b.latency(ctx, cfg.latencyPods); err != nil {
			return fmt.Errorf("start latency: %w", err)
		}
	}
	if !cfg.skipThroughput {
		if err := b.throughput(ctx, cfg); err != nil {
			return fmt.Errorf("scheduler throughput: %w", err)
		}
	}
	if cfg.churnNodes > 0 {
		if err := b.churn(ctx, cfg); err != nil {
			return fmt.Errorf("scheduler under churn: %w", err)
		}
	}
	return nil
}

type bench struct {
	client  kubernetes.Interface
	cluster *scenarios.Cluster
	runner  *scenarios.Runner
}

// namespace creates a namespace with a one-GPU claim template.
func (b *bench) namespace(ctx context.Context, name string) error {
	if _, err := b.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := b.client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no default service account in %s", name)
		}
		time.Sleep(200 * time.Millisecond)
	}
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "one-gpu", Namespace: name},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: vocabulary.DriverName}}},
		}}},
	}
	_, err := b.client.ResourceV1().ResourceClaimTemplates(name).Create(ctx, tmpl, metav1.CreateOptions{})
	return err
}

func (b *bench) deleteNamespace(ctx context.Context, name string) error {
	// Pods bound to nodes without a kubelet never terminate by themselves.
	_ = b.client.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
	if err := b.client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		_, err := b.client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("namespace %s not deleted", name)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// gpuPod is a pod with a one-GPU claim. Its grace period is 1 s, not 0: a pod
// with 0 is removed from the API at once, before the kubelet has stopped it and
// unprepared its claim, so the scheduler could hand its GPU to the next pod while
// it is still prepared on the node (the next prepare then fails and the kubelet
// retries only a minute later).
func gpuPod(ns, name string, nodeSelector map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeSelector:                  nodeSelector,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("one-gpu")}},
			Containers: []corev1.Container{{
				Name: "ctr", Image: image, ImagePullPolicy: corev1.PullIfNotPresent, Command: []string{"sleep", "86400"},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
		},
	}
}

// latency creates pods one after the other on the real node, keeping at most 8
// (one per GPU) alive, and measures create -> bound and create -> Running+Ready.
func (b *bench) latency(ctx context.Context, n int) error {
	const ns = "bench-latency"
	nodes, err := b.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "!" + benchLabel})
	if err != nil || len(nodes.Items) == 0 {
		return fmt.Errorf("no real node: %v", err)
	}
	node := nodes.Items[0].Name
	if err := b.namespace(ctx, ns); err != nil {
		return err
	}
	defer func() { _ = b.deleteNamespace(context.Background(), ns) }()
	fmt.Printf("start latency: %d pods with a one-GPU claim, one after the other, on node %s\n", n, node)

	w, err := b.client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	defer w.Stop()
	events := make(chan *corev1.Pod, 1000)
	go func() {
		for ev := range w.ResultChan() {
			if pod, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Deleted {
				events <- pod
			}
		}
		close(events)
	}()

	var bound, ready []time.Duration
	var alive []string
	for i := range n {
		for len(alive) >= 8 { // every GPU is taken: free the oldest first
			if err := b.client.CoreV1().Pods(ns).Delete(ctx, alive[0], metav1.DeleteOptions{}); err != nil {
				return err
			}
			if err := b.waitGone(ctx, ns, alive[0]); err != nil {
				return err
			}
			alive = alive[1:]
		}
		name := fmt.Sprintf("p%03d", i)
		start := time.Now()
		if _, err := b.client.CoreV1().Pods(ns).Create(ctx, gpuPod(ns, name, map[string]string{"kubernetes.io/hostname": node}), metav1.CreateOptions{}); err != nil {
			return err
		}
		var tBound time.Duration
		timeout := time.After(2 * time.Minute)
	wait:
		for {
			select {
			case pod, ok := <-events:
				if !ok {
					return errors.New("watch closed")
				}
				if pod.Name != name {
					continue
				}
				if tBound == 0 && pod.Spec.NodeName != "" {
					tBound = time.Since(start)
				}
				if pod.Status.Phase == corev1.PodRunning && podReady(pod) {
					ready = append(ready, time.Since(start))
					bound = append(bound, tBound)
					break wait
				}
			case <-timeout:
				return fmt.Errorf("pod %s not Running after 2m", name)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		alive = append(alive, name)
	}
	fmt.Printf("  %-34s p50 %7s  p99 %7s  min %7s  max %7s\n", "create -> bound (scheduler)", pct(bound, 50), pct(bound, 99), pct(bound, 0), pct(bound, 100))
	fmt.Printf("  %-34s p50 %7s  p99 %7s  min %7s  max %7s\n", "create -> Running and Ready", pct(ready, 50), pct(ready, 99), pct(ready, 0), pct(ready, 100))
	return nil
}

func (b *bench) waitGone(ctx context.Context, ns, name string) error {
	for {
		_, err := b.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func pct(d []time.Duration, p int) string {
	if len(d) == 0 {
		return "-"
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[i].Round(time.Millisecond).String()
}

// throughput registers the simulated nodes of both models, then schedules the pods
// against each model in turn.
func (b *bench) throughput(ctx context.Context, cfg config) error {
	models := []struct{ name, policy string }{
		{"full", ""},
		{"whole-gpu", "default: {mig: \"off\", timeSlicing: {enabled: false}, mps: {enabled: false}}\n"},
	}
	var all []string
	defer func() { _ = clusternodes.Remove(context.Background(), b.client, benchLabel, all) }()
	stats := map[string]string{}
	for _, m := range models {
		slices, err := clusternodes.PrintSlices(ctx, cfg.plugin, cfg.machine, m.policy)
		if err != nil {
			return err
		}
		devices := 0
		for _, s := range slices("x") {
			devices += len(s.Spec.Devices)
		}
		stats[m.name] = fmt.Sprintf("%d slices, %d devices per node", len(slices("x")), devices)
		if m.policy != "" && cfg.throughputPods > devices*cfg.nodes {
			// Whole GPUs only: one device per GPU. Pods that cannot fit would
			// wait for ever.
			return fmt.Errorf("-throughput-pods %d is more than the %d GPUs of %d %s nodes; use more -nodes",
				cfg.throughputPods, devices*cfg.nodes, cfg.nodes, cfg.machine)
		}
		for i := range cfg.nodes {
			name := fmt.Sprintf("sim-%s-%02d", m.name, i)
			if err := clusternodes.Add(ctx, b.client, name, map[string]string{benchLabel: m.name}, slices(name)); err != nil {
				return err
			}
			all = append(all, name)
		}
	}
	stopLeases := clusternodes.RenewLeases(ctx, b.client, all)
	defer stopLeases()
	fmt.Printf("\nscheduler throughput: %d pods with a one-GPU claim, created at once, on %d simulated %s nodes per model\n",
		cfg.throughputPods, cfg.nodes, cfg.machine)
	for round := range cfg.rounds {
		order := []int{0, 1}
		if round%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			m := models[i]
			ns := fmt.Sprintf("bench-%s-%d", m.name, round)
			if err := b.namespace(ctx, ns); err != nil {
				return err
			}
			d, err := b.schedule(ctx, ns, cfg.throughputPods, map[string]string{benchLabel: m.name})
			_ = b.deleteNamespace(ctx, ns)
			if err != nil {
				return fmt.Errorf("model %s: %w", m.name, err)
			}
			fmt.Printf("  round %d %-10s (%s): %d pods bound in %s = %.1f pods/s\n", round+1, m.name, stats[m.name],
				cfg.throughputPods, d.Round(time.Millisecond), float64(cfg.throughputPods)/d.Seconds())
		}
	}
	return nil
}

// schedule creates n pods at once and returns the time from the first create to
// the last bind (polled every 100 ms).
func (b *bench) schedule(ctx context.Context, ns string, n int, selector map[string]string) (time.Duration, error) {
	start := time.Now()
	errs := make(chan error, n)
	sem := make(chan struct{}, 50)
	for i := range n {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			_, err := b.client.CoreV1().Pods(ns).Create(ctx, gpuPod(ns, fmt.Sprintf("p%03d", i), selector), metav1.CreateOptions{})
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			return 0, err
		}
	}
	created := time.Since(start)
	deadline := time.Now().Add(5 * time.Minute)
	lastReport := time.Now()
	for {
		pods, err := b.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, err
		}
		bound := 0
		var pending string
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" {
				bound++
			} else {
				pending = p.Name
			}
		}
		if bound == n {
			return time.Since(start), nil
		}
		if time.Since(lastReport) > 10*time.Second {
			fmt.Printf("    ... %d of %d bound after %s\n", bound, n, time.Since(start).Round(time.Second))
			lastReport = time.Now()
		}
		if time.Now().After(deadline) {
			evs, _ := b.runner.PodEvents(ctx, ns, pending)
			return 0, fmt.Errorf("%d of %d pods bound after 5m (created in %s); %s: %v", bound, n, created, pending, evs)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
