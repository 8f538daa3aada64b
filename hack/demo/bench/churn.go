package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/internal/standin/clusternodes"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// model is a device policy the simulated nodes publish ("" is the default:
// the full model) and the reserve policy they run (the plugin prints the
// full model; the reserve policy hides part of it as the node publishes).
type model struct {
	name, policy string
	reserve      devicemodel.ReservePolicy
}

// baseline is the model the others are compared with.
const baseline = "whole-gpu"

var models = []model{
	{name: baseline, policy: "default: {mig: \"off\", timeSlicing: {enabled: false}, mps: {enabled: false}}\n"},
	{name: "full"},
	{name: "reserve-k1", reserve: devicemodel.ReservePolicy{SpareGPUs: 1}},
}

// churnModels picks the models -churn-models names, the baseline first.
func churnModels(names string) ([]model, error) {
	out := []model{models[0]}
	for name := range strings.SplitSeq(names, ",") {
		i := slices.IndexFunc(models, func(m model) bool { return m.name == name })
		switch {
		case name == baseline:
		case i < 0:
			return nil, fmt.Errorf("-churn-models: unknown model %q (have whole-gpu, full, reserve-k1)", name)
		default:
			out = append(out, models[i])
		}
	}
	if len(out) < 2 {
		return nil, fmt.Errorf("-churn-models %q: name a model besides %s", names, baseline)
	}
	return out, nil
}

// phase is what one stretch of scheduling cost: pods bound, wall time,
// kube-scheduler CPU, and the scheduler's own count of attempts that
// found no node.
type phase struct {
	pods          int
	took          time.Duration
	schedCPU      time.Duration
	benchCPU      time.Duration
	unschedulable float64
	attempts      float64 // negative: the metrics were not read
	publications  int64
	load          string
	planeCPU      map[string]time.Duration // other control-plane processes
}

func (p phase) podsPerSecond() float64 { return float64(p.pods) / p.took.Seconds() }
func (p phase) cpuPerPod() time.Duration {
	return p.schedCPU / time.Duration(max(1, p.pods))
}

func (p phase) String() string {
	attempts := "scheduler metrics not read"
	if p.attempts > 0 {
		attempts = fmt.Sprintf("%.0f of %.0f attempts unschedulable", p.unschedulable, p.attempts)
	}
	perPod := func(d time.Duration) float64 {
		return float64((d / time.Duration(max(1, p.pods))).Microseconds()) / 1000
	}
	var plane strings.Builder
	for _, name := range slices.Sorted(maps.Keys(p.planeCPU)) {
		fmt.Fprintf(&plane, ", %s %.1f", name, perPod(p.planeCPU[name]))
	}
	return fmt.Sprintf("%4d pods in %6s = %5.1f pods/s, scheduler CPU %5.1f ms/pod (bench %4.1f%s ms/pod), %s, %4d slice updates, load %s",
		p.pods, p.took.Round(100*time.Millisecond), p.podsPerSecond(), float64(p.cpuPerPod().Microseconds())/1000,
		perPod(p.benchCPU), plane.String(), attempts, p.publications, p.load)
}

// add sums phases, for the figures over all rounds.
func (p phase) add(q phase) phase {
	plane := maps.Clone(p.planeCPU)
	if plane == nil {
		plane = map[string]time.Duration{}
	}
	for name, v := range q.planeCPU {
		plane[name] += v
	}
	return phase{pods: p.pods + q.pods, took: p.took + q.took, schedCPU: p.schedCPU + q.schedCPU, benchCPU: p.benchCPU + q.benchCPU,
		unschedulable: p.unschedulable + q.unschedulable, attempts: p.attempts + q.attempts, publications: p.publications + q.publications,
		planeCPU: plane}
}

// churn compares the models on the real scheduler the way a busy cluster
// uses it: per model, cfg.churnNodes simulated nodes whose slices follow
// what is allocated on them (clusternodes.Follow), one-GPU pods arriving
// until cfg.fill of the GPUs are taken, then cfg.churnPods pods deleted and
// replaced with at most cfg.backlog pods waiting. The models take turns,
// each with nodes of its own; the ratios are of the same run.
func (b *bench) churn(ctx context.Context, cfg config) error {
	sched, err := newScheduler(b.cluster.Config, cfg.schedulerPID, cfg.schedulerURL, cfg.controlPlanePIDs)
	if err != nil {
		return err
	}
	turns, err := churnModels(cfg.churnModels)
	if err != nil {
		return err
	}
	if cfg.profile+cfg.apiserverProfile+cfg.benchProfile != "" && !slices.ContainsFunc(turns, func(m model) bool { return m.name == "full" }) {
		return fmt.Errorf("-profile, -apiserver-profile and -bench-profile profile the full model's churn: -churn-models %q has no full", cfg.churnModels)
	}
	printed := map[string]func(string) []*resourceapi.ResourceSlice{}
	devices := map[string]int{}
	for _, m := range turns {
		slices, err := clusternodes.PrintSlices(ctx, cfg.plugin, cfg.machine, m.policy)
		if err != nil {
			return err
		}
		printed[m.name] = slices
		for _, s := range slices("x") {
			devices[m.name] += len(s.Spec.Devices)
		}
	}
	gpus := devices[baseline] // one device per GPU
	target := int(cfg.fill * float64(gpus*cfg.churnNodes))
	fmt.Printf("\nscheduler under churn: %d simulated %s nodes per model (slices follow what is allocated on them), one-GPU pods until %d of %d GPUs are taken, then %d deleted and replaced (at most %d waiting)\n",
		cfg.churnNodes, cfg.machine, target, gpus*cfg.churnNodes, cfg.churnPods, cfg.backlog)
	fmt.Printf("  devices per node (the model in full; the reserve policy publishes fewer): %v; kube-scheduler pid %d\n", devices, cfg.schedulerPID)
	totals := map[string][2]phase{}
	for round := range cfg.churnRounds {
		// Each round starts with another model, so no model always
		// follows the same one (and pays for its garbage).
		order := append(slices.Clone(turns[round%len(turns):]), turns[:round%len(turns)]...)
		for _, m := range order {
			profile := m.name == "full" && round == cfg.churnRounds-1
			fill, churn, err := b.churnModel(ctx, cfg, sched, m, round, printed[m.name], target, profile)
			if err != nil {
				return fmt.Errorf("model %s: %w", m.name, err)
			}
			fmt.Printf("  round %d %-10s fill : %s\n", round+1, m.name, fill)
			fmt.Printf("  round %d %-10s churn: %s\n", round+1, m.name, churn)
			t := totals[m.name]
			totals[m.name] = [2]phase{t[0].add(fill), t[1].add(churn)}
		}
	}
	base := totals[baseline]
	for _, m := range turns[1:] {
		got := totals[m.name]
		for i, what := range []string{"fill", "churn"} {
			fmt.Printf("  all rounds, %-5s: %s ÷ %s: pods/s %.2f× (goal ≥ 0.8×), scheduler CPU per pod %.2f× (goal ≤ 1.5×); %s %.1f pods/s %.1f ms/pod, %s %.1f pods/s %.1f ms/pod\n",
				what, m.name, baseline, got[i].podsPerSecond()/base[i].podsPerSecond(), float64(got[i].cpuPerPod())/float64(base[i].cpuPerPod()),
				m.name, got[i].podsPerSecond(), float64(got[i].cpuPerPod().Microseconds())/1000,
				baseline, base[i].podsPerSecond(), float64(base[i].cpuPerPod().Microseconds())/1000)
		}
	}
	return nil
}

// churnModel runs one model's fill and churn on nodes of its own and
// removes them after; with profile, it takes the CPU profiles the flags ask
// for over the churn.
func (b *bench) churnModel(ctx context.Context, cfg config, sched *scheduler, m model, round int,
	slices func(string) []*resourceapi.ResourceSlice, target int, profile bool) (phase, phase, error) {
	ctx, cancel := context.WithCancel(ctx) // the pod watch, leases and publishers of this model
	defer cancel()
	label := map[string]string{benchLabel: "churn-" + m.name}
	resources := map[string]resourceslice.DriverResources{}
	var names []string
	defer func() { _ = clusternodes.Remove(context.Background(), b.client, benchLabel+"=churn-"+m.name, names) }()
	for i := range cfg.churnNodes {
		name := fmt.Sprintf("churn-%s-%02d", m.name, i)
		if err := clusternodes.Add(ctx, b.client, name, label, nil); err != nil {
			return phase{}, phase{}, err
		}
		names = append(names, name)
		res, err := clusternodes.Resources(slices(name))
		if err != nil {
			return phase{}, phase{}, err
		}
		resources[name] = res
	}
	stopLeases := clusternodes.RenewLeases(ctx, b.client, names)
	defer stopLeases()
	followStart := time.Now()
	followers, err := clusternodes.Follow(ctx, b.client, vocabulary.DriverName, resources, m.reserve)
	if err != nil {
		return phase{}, phase{}, err
	}
	defer followers.Stop()
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		return followers.Published(), nil
	}); err != nil {
		return phase{}, phase{}, fmt.Errorf("slices of %d nodes not all published after 3m: %w", len(names), err)
	}
	if m.reserve.Enabled() {
		// Nodes of a real cluster start long before their pods come: the
		// fill should not pay for every node ending its start hold (each
		// GPU's MIG placements and shares published for the hold after the
		// first publication, then withdrawn) in the middle of it.
		if err := settle(ctx, followers, followStart.Add(m.reserve.Hold())); err != nil {
			return phase{}, phase{}, err
		}
	}

	ns := fmt.Sprintf("bench-churn-%s-%d", m.name, round)
	if err := b.namespace(ctx, ns); err != nil {
		return phase{}, phase{}, err
	}
	defer func() { _ = b.deleteNamespace(context.Background(), ns) }()
	pods := watchPods(ctx, b, ns)
	c := &churner{b: b, ns: ns, selector: label, pods: pods}

	start := sched.sample(ctx, followers)
	if err := c.create(ctx, target); err != nil {
		return phase{}, phase{}, err
	}
	if err := pods.waitBound(ctx, target, 5*time.Minute); err != nil {
		fmt.Print(b.stallReport(ctx, sched, ns, benchLabel+"=churn-"+m.name))
		return phase{}, phase{}, fmt.Errorf("fill: %w", err)
	}
	filled := sched.sample(ctx, followers)
	fill := filled.since(start, target)
	stored, byHeld := followers.Stored()
	fmt.Printf("  round %d %-10s filled: %d devices published on %d nodes; nodes by devices allocated on them: %v\n",
		round+1, m.name, stored, len(names), byHeld)

	var profiled, apiserverProfiled <-chan error
	if profile && cfg.profile != "" {
		profiled = sched.profile(ctx, cfg.profile, cfg.profileSeconds)
	}
	if profile && cfg.apiserverProfile != "" {
		client, err := rest.HTTPClientFor(b.cluster.Config)
		if err != nil {
			return phase{}, phase{}, fmt.Errorf("kube-apiserver profile: %w", err)
		}
		apiserverProfiled = fetchProfile(ctx, client, b.cluster.Config.Host, cfg.apiserverProfile, cfg.profileSeconds)
	}
	if profile && cfg.benchProfile != "" {
		stop, err := profileSelf(cfg.benchProfile)
		if err != nil {
			return phase{}, phase{}, err
		}
		defer stop()
	}
	if err := c.replace(ctx, cfg.churnPods, cfg.backlog); err != nil {
		return phase{}, phase{}, fmt.Errorf("churn: %w", err)
	}
	if err := pods.waitBound(ctx, target+cfg.churnPods, 5*time.Minute); err != nil {
		fmt.Print(b.stallReport(ctx, sched, ns, benchLabel+"=churn-"+m.name))
		return phase{}, phase{}, fmt.Errorf("churn: %w", err)
	}
	churn := sched.sample(ctx, followers).since(filled, cfg.churnPods)
	if apiserverProfiled != nil {
		if err := <-apiserverProfiled; err != nil {
			fmt.Fprintf(os.Stderr, "bench: kube-apiserver CPU profile: %v\n", err)
		} else {
			fmt.Printf("  kube-apiserver CPU profile of the full model's churn (first %ds): %s\n", cfg.profileSeconds, cfg.apiserverProfile)
		}
	}
	if profiled != nil {
		if err := <-profiled; err != nil {
			fmt.Fprintf(os.Stderr, "bench: scheduler CPU profile: %v\n", err)
		} else {
			fmt.Printf("  scheduler CPU profile of the full model's churn (first %ds): %s\n", cfg.profileSeconds, cfg.profile)
		}
	}
	return fill, churn, nil
}

// churner creates and deletes the pods of one namespace.
type churner struct {
	b        *bench
	ns       string
	selector map[string]string
	pods     *podWatch
	next     int
}

// create creates n pods, 50 at a time.
func (c *churner) create(ctx context.Context, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 50)
	for range n {
		name := fmt.Sprintf("p%05d", c.next)
		c.next++
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if _, err := c.b.client.CoreV1().Pods(c.ns).Create(ctx, gpuPod(c.ns, name, c.selector), metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return errors.Join(<-errs)
}

// replace deletes n bound pods, at random, and creates one pod for each,
// keeping at most backlog pods waiting to be bound (20 replacements in
// flight, so the API round trips do not pace the scheduler). A pod is
// deleted at once (grace 0): no kubelet would confirm its end.
func (c *churner) replace(ctx context.Context, n, backlog int) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	sem := make(chan struct{}, 20)
	for done := 0; done < n; {
		mu.Lock()
		failed := errors.Join(errs...)
		mu.Unlock()
		if failed != nil {
			wg.Wait()
			return failed
		}
		if c.next-c.pods.boundCount() >= backlog {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		victim := c.pods.takeBound()
		if victim == "" {
			return errors.New("no bound pod to delete")
		}
		name := fmt.Sprintf("p%05d", c.next)
		c.next++
		done++
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			pods := c.b.client.CoreV1().Pods(c.ns)
			err := pods.Delete(ctx, victim, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			if err == nil {
				_, err = pods.Create(ctx, gpuPod(c.ns, name, c.selector), metav1.CreateOptions{})
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("replace pod %s with %s: %w", victim, name, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// podWatch follows the pods of a namespace: which are bound, and how many
// were ever bound.
type podWatch struct {
	mu     sync.Mutex
	bound  map[string]bool // bound and not taken for deletion
	binds  int
	seen   map[string]bool
	random *rand.Rand
}

func watchPods(ctx context.Context, b *bench, ns string) *podWatch {
	w := &podWatch{bound: map[string]bool{}, seen: map[string]bool{}, random: rand.New(rand.NewPCG(1, 2))}
	factory := informers.NewSharedInformerFactoryWithOptions(b.client, 0, informers.WithNamespace(ns))
	informer := factory.Core().V1().Pods().Informer()
	observe := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Spec.NodeName == "" {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if !w.seen[pod.Name] {
			w.seen[pod.Name] = true
			w.bound[pod.Name] = true
			w.binds++
		}
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: observe, UpdateFunc: func(_, obj any) { observe(obj) }})
	factory.Start(ctx.Done())
	cache.WaitForCacheSync(ctx.Done(), informer.HasSynced)
	return w
}

func (w *podWatch) boundCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.binds
}

// takeBound picks a bound pod at random and forgets it.
func (w *podWatch) takeBound() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.bound) == 0 {
		return ""
	}
	i := w.random.IntN(len(w.bound))
	for name := range w.bound {
		if i == 0 {
			delete(w.bound, name)
			return name
		}
		i--
	}
	return ""
}

// waitBound waits until n pods were bound in all.
func (w *podWatch) waitBound(ctx context.Context, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := time.Now()
	for w.boundCount() < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d pods bound after %s", w.boundCount(), n, timeout)
		}
		if time.Since(last) > 15*time.Second {
			fmt.Printf("    ... %d of %d bound\n", w.boundCount(), n)
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// profileSelf writes this process's CPU profile to path until stop.
func profileSelf(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("bench CPU profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("bench CPU profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
		fmt.Printf("  bench CPU profile of the full model's churn: %s\n", path)
	}, nil
}

// settle waits until after and then until the followers have published
// nothing for two seconds.
func settle(ctx context.Context, f *clusternodes.Followers, after time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(after)):
	}
	last, quiet := f.Publications(), 0
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, false, func(context.Context) (bool, error) {
		now := f.Publications()
		if now != last {
			last, quiet = now, 0
			return false, nil
		}
		quiet++
		return quiet >= 4 && f.Published(), nil
	}); err != nil {
		return fmt.Errorf("nodes still publishing 3m after their start hold: %w", err)
	}
	return nil
}
