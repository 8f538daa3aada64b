package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Load of TestRollingUpgradeZeroDowntime: a pod a second for at least a
// minute, cycling through these claim templates.
const (
	streamInterval = time.Second
	streamMinimum  = time.Minute
	upgradeTag     = "e2e-rolling"
)

var streamKinds = []string{"gpu", "mig", "ts", "mps"}

// TestRollingUpgradeZeroDowntime: `helm upgrade` to a new image tag and back
// while GPU pods keep coming on every node of the fleet (whole GPUs, MIG
// where the GPUs have it, time-slicing and MPS shares): the DaemonSet moves
// node by node (maxSurge 1: one node at a time has two plugin pods), on each
// node the new plugin pod serves beside the old one and takes the node over
// from it, so no prepare fails and every pod runs. Prints the pod start times
// (created → Running) before and during the upgrade.
func TestRollingUpgradeZeroDowntime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	nodes := useFleet(t, 1)
	ns := newNamespace(t, ctx, "e2e-rolling")
	claimTemplate(t, ctx, ns, "gpu", resourceapi.ExactDeviceRequest{DeviceClassName: driverName})
	claimTemplate(t, ctx, ns, "mig", resourceapi.ExactDeviceRequest{DeviceClassName: "mig." + driverName,
		Selectors: celSelector(`device.attributes["gpu.dra.dev"].profile == "2g.20gb"`)})
	claimTemplate(t, ctx, ns, "ts", resourceapi.ExactDeviceRequest{DeviceClassName: "timeslice." + driverName})
	claimTemplate(t, ctx, ns, "mps", resourceapi.ExactDeviceRequest{DeviceClassName: "mps." + driverName})

	repo, tag := pluginImage(t, ctx)
	ctr(t, ctx, "images", "tag", "--force", repo+":"+tag, repo+":"+upgradeTag)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, now := pluginImage(t, ctx); now != tag {
			helm(t, ctx, "upgrade", env.release, chartDir(), "-n", env.namespace, "--reuse-values",
				"--set", "image.tag="+tag, "--wait", "--timeout", "5m")
		}
		ctr(t, ctx, "images", "rm", repo+":"+upgradeTag)
	})

	s := &stream{ns: ns, start: time.Now(), nodes: nodes, mig: map[string]bool{}}
	for _, n := range nodes {
		s.mig[n] = len(nodeDevicesOfType(t, ctx, n, "mig")) > 0
	}
	pluginPods := watchPluginPods(ctx, nodes)
	streamDone := make(chan struct{})
	streamCtx, stopStream := context.WithCancel(ctx)
	defer stopStream()
	go func() { defer close(streamDone); s.run(streamCtx) }()

	time.Sleep(20 * time.Second) // the "before" sample
	s.mark()                     // the upgrade starts
	for _, to := range []string{upgradeTag, tag} {
		old := map[string]types.UID{}
		for _, n := range nodes {
			old[n] = pluginPodOn(t, ctx, n).UID
		}
		t.Logf("helm upgrade to image tag %s", to)
		helm(t, ctx, "upgrade", env.release, chartDir(), "-n", env.namespace, "--reuse-values",
			"--set", "image.tag="+to, "--wait", "--timeout", "8m")
		for _, n := range nodes {
			waitNewPluginPodOn(t, ctx, n, old[n])
		}
	}
	s.mark() // the upgrade is done
	if rest := streamMinimum - time.Since(s.start); rest > 0 {
		time.Sleep(rest)
	}
	time.Sleep(5 * time.Second) // a few pods after the upgrade
	stopStream()
	<-streamDone
	most, surging, restarts := pluginPods()

	s.report(t)
	for _, r := range restarts {
		t.Errorf("plugin pod %s during the upgrade", r)
	}
	for _, n := range nodes {
		if most[n] < 2 {
			t.Errorf("at most %d plugin pod(s) on %s at once: the DaemonSet did not surge there (maxSurge 1)", most[n], n)
		}
	}
	if surging > 1 {
		t.Errorf("%d nodes had two plugin pods at once: the DaemonSet did not move node by node (maxSurge 1)", surging)
	}
	failedPrepares(t, ctx, ns)
}

// stream creates one pod per interval, each with a claim of the next kind,
// waits for it to run, records how long that took, and deletes it.
type stream struct {
	ns    string
	start time.Time
	nodes []string        // pod i runs on nodes[i%len(nodes)]
	mig   map[string]bool // the node has MIG devices (else mig pods take whole GPUs)

	mu       sync.Mutex
	marks    []time.Time // upgrade start, end
	starts   []podStart
	failures []string
	wg       sync.WaitGroup
}

type podStart struct {
	created time.Time
	took    time.Duration
}

func (s *stream) mark() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.marks = append(s.marks, time.Now())
}

func (s *stream) run(ctx context.Context) {
	tick := time.NewTicker(streamInterval)
	defer tick.Stop()
	for i := 0; ; i++ {
		node := s.nodes[i%len(s.nodes)]
		kind := streamKinds[i/len(s.nodes)%len(streamKinds)]
		if kind == "mig" && !s.mig[node] {
			kind = "gpu"
		}
		s.wg.Add(1)
		go s.one(ctx, fmt.Sprintf("%s-%03d", kind, i), kind, node)
		select {
		case <-ctx.Done():
			s.wg.Wait()
			return
		case <-tick.C:
		}
	}
}

// one runs one pod of the stream. Its own deadlines are generous (pods
// wait for free GPUs, and for the hand-over, on 2 loaded cores).
func (s *stream) one(streamCtx context.Context, name, template, node string) {
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(streamCtx), 5*time.Minute)
	defer cancel()
	c := env.cluster.Client.CoreV1().Pods(s.ns)
	pod := onNodes(newClaimPod(s.ns, name, template), node)
	created := time.Now()
	if _, err := c.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		s.fail("create pod %s: %v", name, err)
		return
	}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := c.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil // transient; the deadline decides
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod is %s: %s", p.Status.Phase, p.Status.Message)
		}
		return p.Status.Phase == corev1.PodRunning, nil
	})
	took := time.Since(created)
	if err != nil {
		evs, _ := env.runner.PodEvents(ctx, s.ns, name)
		s.fail("pod %s did not run: %v; events: %s", name, err, strings.Join(evs, "; "))
	} else {
		s.mu.Lock()
		s.starts = append(s.starts, podStart{created: created, took: took})
		s.mu.Unlock()
	}
	// Free the device for the next pods.
	if err := c.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		s.fail("delete pod %s: %v", name, err)
	}
}

func (s *stream) fail(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, fmt.Sprintf(format, args...))
}

// report fails the test for pods that did not run and logs the start time
// percentiles of the pods created before and during the upgrade.
func (s *stream) report(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.failures {
		t.Error(f)
	}
	if len(s.marks) != 2 {
		t.Fatalf("upgrade marks %v", s.marks)
	}
	var before, during, after []time.Duration
	for _, p := range s.starts {
		switch {
		case p.created.Before(s.marks[0]):
			before = append(before, p.took)
		case p.created.Before(s.marks[1]):
			during = append(during, p.took)
		default:
			after = append(after, p.took)
		}
	}
	t.Logf("%d pods ran in %s (%d failed); the upgrade (there and back) took %s",
		len(s.starts), time.Since(s.start).Round(time.Second), len(s.failures), s.marks[1].Sub(s.marks[0]).Round(time.Second))
	for _, phase := range []struct {
		name  string
		times []time.Duration
	}{{"before", before}, {"during", during}, {"after", after}} {
		fmt.Printf("pod start (created → Running) %-6s the upgrade: %3d pods, p50 %6s, p99 %6s\n",
			phase.name, len(phase.times), percentile(phase.times, 50), percentile(phase.times, 99))
	}
	if len(during) == 0 {
		t.Error("no pod was created during the upgrade")
	}
}

func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	i := (len(sorted)*p + 99) / 100 // nearest rank
	return sorted[max(i-1, 0)].Round(10 * time.Millisecond)
}

// failedPrepares fails the test for any event of a failed prepare or
// unprepare in ns, and logs the other warnings.
func failedPrepares(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	evs, err := env.cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	others := map[string]int{}
	for _, e := range evs.Items {
		if e.Type != corev1.EventTypeWarning {
			continue
		}
		// FailedPrepareDynamicResources, or a pod sync error naming the driver.
		if strings.Contains(e.Reason, "Prepare") || strings.Contains(e.Message, driverName) || strings.Contains(e.Message, "NodePrepareResources") {
			t.Errorf("%s %s: %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
			continue
		}
		others[e.Reason]++ // e.g. FailedScheduling while GPUs are busy, MissingClusterDNS here
	}
	if len(others) > 0 {
		t.Logf("other warnings (not prepares): %v", others)
	}
}

// pluginImage returns the plugin DaemonSet's image repository and tag.
func pluginImage(t *testing.T, ctx context.Context) (repo, tag string) {
	t.Helper()
	dss, err := env.cluster.Client.AppsV1().DaemonSets(env.namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=kubelet-plugin"})
	if err != nil || len(dss.Items) == 0 {
		t.Fatalf("no kubelet plugin DaemonSet in %s: %v", env.namespace, err)
	}
	image := dss.Items[0].Spec.Template.Spec.Containers[0].Image
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		t.Fatalf("plugin image %q has no tag", image)
	}
	return image[:i], image[i+1:]
}

// ctr runs containerd's ctr in the kubelet's namespace of every node's
// containerd (GDD_CONTAINERD_ADDRESSES, else CONTAINERD_ADDRESS, from the
// cluster's env, as make e2e sets them).
func ctr(t *testing.T, ctx context.Context, args ...string) {
	t.Helper()
	addrs := strings.Fields(os.Getenv("GDD_CONTAINERD_ADDRESSES"))
	if len(addrs) == 0 {
		addrs = []string{os.Getenv("CONTAINERD_ADDRESS")}
	}
	for _, a := range addrs {
		cmd := exec.CommandContext(ctx, getenv("E2E_CTR", "ctr"), append([]string{"-n", "k8s.io"}, args...)...)
		if a != "" {
			cmd.Env = append(os.Environ(), "CONTAINERD_ADDRESS="+a)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("ctr %s (containerd %s): %v\n%s", strings.Join(args, " "), a, err, out)
		}
	}
}

// watchPluginPods watches the nodes' plugin pods every half second until
// ctx ends; the returned function gives the most seen at once on each node,
// the most nodes seen with two pods not yet deleting at once (the rollout's
// surge), and the plugin container restarts seen (a crash during the hand-over); those of
// the pods already there at the first look count from then: an earlier test
// may have restarted the pod the upgrade starts from
// (TestLivenessRestartsWedgedPlugin does).
func watchPluginPods(ctx context.Context, nodes []string) func() (most map[string]int, surging int, restarts []string) {
	var mu sync.Mutex
	most, surging, restarted, first := map[string]int{}, 0, map[string]int32{}, map[string]int32{}
	go func() {
		for looked := false; ctx.Err() == nil; {
			pods, err := env.cluster.Client.CoreV1().Pods(env.namespace).List(ctx, metav1.ListOptions{
				LabelSelector: "app.kubernetes.io/component=kubelet-plugin",
			})
			if err == nil {
				mu.Lock()
				now, live := map[string]int{}, map[string]int{}
				for i := range pods.Items {
					p := &pods.Items[i]
					if !slices.Contains(nodes, p.Spec.NodeName) {
						continue
					}
					now[p.Spec.NodeName]++
					if p.DeletionTimestamp == nil {
						live[p.Spec.NodeName]++ // an old pod handing over is done with the rollout
					}
					name, n := p.Name, pluginRestarts(p)
					if !looked {
						first[name] = n // absent later: 0
					}
					if n -= first[name]; n > 0 {
						restarted[name] = max(restarted[name], n)
					}
				}
				two := 0
				for n, k := range now {
					most[n] = max(most[n], k)
					if live[n] > 1 {
						two++
					}
				}
				surging = max(surging, two)
				looked = true
				mu.Unlock()
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	return func() (map[string]int, int, []string) {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for name, n := range restarted {
			out = append(out, fmt.Sprintf("%s restarted %d times", name, n))
		}
		return maps.Clone(most), surging, out
	}
}
