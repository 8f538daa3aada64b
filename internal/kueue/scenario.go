package kueue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Team is one team's batch queue on the cluster: a ClusterQueue with its
// quota, a LocalQueue in its namespace, and the jobs Run submits.
type Team struct {
	C         *scenarios.Cluster
	Driver    string
	Namespace string
	Queue     string // the ClusterQueue's and the LocalQueue's name
	Quota     Quota
	// Costs are the MIG profiles' costs (ProfileCosts), for the MIG step.
	Costs map[string]Cost
	// ShortJob is how long a job that frees capacity runs.
	ShortJob time.Duration
	Image    string
	Timeout  time.Duration
	Logf     func(format string, args ...any)

	createdClasses []string
}

// Step is what one part of Run showed: a job that waited in the queue with
// Kueue's reason while another held the quota, then was admitted when that one
// finished.
type Step struct {
	Name string
	// Holder and Waiter are the Jobs; Reason is the Waiter's QuotaReserved
	// message while it waited.
	Holder, Waiter string
	Reason         string
	// Usage is the quota each Job's Workload held once admitted.
	Usage map[string]map[string]int64
	// WaiterPods are the Waiter's pods, all Running at the end.
	WaiterPods []string
}

const flavorName = "gdd-default"

// Setup creates the flavor, the ClusterQueue, the namespace and its LocalQueue,
// and the per-profile DeviceClasses serving the MIG step's names if the chart
// does not.
func (t *Team) Setup(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: t.Namespace}}
	if _, err := t.C.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", t.Namespace, err)
	}
	for _, o := range []*unstructured.Unstructured{
		kueueObject("ResourceFlavor", "", flavorName, map[string]any{}),
		clusterQueue(t.Queue, flavorName, t.Namespace, t.Quota),
		kueueObject("LocalQueue", t.Namespace, t.Queue, map[string]any{"clusterQueue": t.Queue}),
	} {
		if err := t.C.Apply(ctx, o); err != nil {
			return err
		}
	}
	small, big := t.profiles()
	for _, p := range []string{small, big} {
		dc := deviceclass.ProfileClass{Profile: p}.DeviceClass(t.Driver)
		_, err := t.C.Client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{})
		switch {
		case err == nil:
			t.createdClasses = append(t.createdClasses, dc.Name)
		case !apierrors.IsAlreadyExists(err):
			return fmt.Errorf("create DeviceClass %s: %w", dc.Name, err)
		}
	}
	return t.poll(ctx, "ClusterQueue "+t.Queue+" active", func(ctx context.Context) (bool, error) {
		cq, err := t.C.Dynamic.Resource(clusterQueueGVR).Get(ctx, t.Queue, metav1.GetOptions{})
		return err == nil && conditionTrue(cq, "Active"), nil
	})
}

// profiles are the cheapest and the dearest MIG profile (by compute slices,
// then memory slices, then name).
func (t *Team) profiles() (small, big string) {
	names := make([]string, 0, len(t.Costs))
	for p := range t.Costs {
		names = append(names, p)
	}
	slices.SortFunc(names, func(a, b string) int {
		ca, cb := t.Costs[a], t.Costs[b]
		if ca.ComputeSlices != cb.ComputeSlices {
			return int(ca.ComputeSlices - cb.ComputeSlices)
		}
		if ca.MemorySlices != cb.MemorySlices {
			return int(ca.MemorySlices - cb.MemorySlices)
		}
		return strings.Compare(a, b)
	})
	return names[0], names[len(names)-1]
}

// Run shows the three kinds of quota one after the other.
func (t *Team) Run(ctx context.Context) ([]Step, error) {
	var steps []Step
	for _, f := range []func(context.Context) (Step, error){t.gpuGang, t.mig, t.mps} {
		s, err := f(ctx)
		if err != nil {
			return steps, fmt.Errorf("%s: %w", s.Name, err)
		}
		steps = append(steps, s)
	}
	return steps, nil
}

// gpuGang: a 2-GPU job holds the quota; a gang of 3 one-GPU pods (an in-tree
// PodGroup with minCount 3) needs 3 more than the 4 of the quota and waits, as
// a whole; when the first job ends it is admitted and all three start.
func (t *Team) gpuGang(ctx context.Context) (Step, error) {
	s := Step{Name: "gpus+gang", Holder: "gpu-solo", Waiter: "gpu-gang"}
	holder := job(t.Namespace, s.Holder, t.Queue, 1, t.shortSeconds(), extendedResourcePod(t.Image, "nvidia.com/gpu", t.Quota.GPUs-2))
	spec := extendedResourcePod(t.Image, "nvidia.com/gpu", 1)
	spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: new(s.Waiter)}
	waiter := job(t.Namespace, s.Waiter, t.Queue, 3, 86400, spec)
	gang := func(ctx context.Context) error {
		wl := &schedulingv1beta1.Workload{
			ObjectMeta: metav1.ObjectMeta{Name: s.Waiter, Namespace: t.Namespace},
			Spec: schedulingv1beta1.WorkloadSpec{PodGroupTemplates: []schedulingv1beta1.PodGroupTemplate{{
				Name: "workers", SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 3}},
			}}},
		}
		if _, err := t.C.Client.SchedulingV1beta1().Workloads(t.Namespace).Create(ctx, wl, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create Workload %s: %w", wl.Name, err)
		}
		pg := &schedulingv1beta1.PodGroup{
			ObjectMeta: metav1.ObjectMeta{Name: s.Waiter, Namespace: t.Namespace},
			Spec: schedulingv1beta1.PodGroupSpec{
				WorkloadRef:      &schedulingv1beta1.WorkloadReference{WorkloadName: s.Waiter, TemplateName: "workers"},
				SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 3}},
			},
		}
		if _, err := t.C.Client.SchedulingV1beta1().PodGroups(t.Namespace).Create(ctx, pg, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create PodGroup %s: %w", pg.Name, err)
		}
		return nil
	}
	if err := t.queueAndFree(ctx, &s, holder, waiter, []string{"nvidia.com/gpu"}, gang); err != nil {
		return s, err
	}
	// Kueue (client-go v0.35, which has no schedulingGroup) patched the Job's
	// template at admission: the pods must still name their PodGroup.
	pods, err := t.jobPods(ctx, waiter)
	if err != nil {
		return s, err
	}
	for _, p := range pods {
		if g := p.Spec.SchedulingGroup; g == nil || g.PodGroupName == nil || *g.PodGroupName != s.Waiter {
			return s, fmt.Errorf("pod %s of the gang does not name PodGroup %s: spec.schedulingGroup %+v", p.Name, s.Waiter, g)
		}
	}
	return s, nil
}

// mig: a job with the cheapest profile holds part of a GPU's worth of MIG
// quota; one with the dearest (7g) needs the whole of it and waits.
func (t *Team) mig(ctx context.Context) (Step, error) {
	small, big := t.profiles()
	s := Step{Name: "mig", Holder: "mig-" + sanitize(small), Waiter: "mig-" + sanitize(big)}
	holder := job(t.Namespace, s.Holder, t.Queue, 1, t.shortSeconds(), extendedResourcePod(t.Image, vocabulary.MIGResourceName(small), 1))
	waiter := job(t.Namespace, s.Waiter, t.Queue, 1, 86400, extendedResourcePod(t.Image, vocabulary.MIGResourceName(big), 1))
	// Kueue names one or both counters (it may stop at the first one short, in map order).
	return s, t.queueAndFree(ctx, &s, holder, waiter, []string{ResourceComputeSlices, ResourceMemorySlices}, nil)
}

// mps: two pods with an MPS share each hold the quota of shares; a third waits.
func (t *Team) mps(ctx context.Context) (Step, error) {
	s := Step{Name: "mps", Holder: "mps-pair", Waiter: "mps-third"}
	class := mpsClassName(t.Driver)
	tmpl := mpsTemplate(t.Namespace, "mps-quarter", class, "25", "10Gi")
	if _, err := t.C.Client.ResourceV1().ResourceClaimTemplates(t.Namespace).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		return s, fmt.Errorf("create ResourceClaimTemplate %s: %w", tmpl.Name, err)
	}
	holder := job(t.Namespace, s.Holder, t.Queue, int32(t.Quota.MPSShares), t.shortSeconds(), claimPod(t.Image, tmpl.Name))
	waiter := job(t.Namespace, s.Waiter, t.Queue, 1, 86400, claimPod(t.Image, tmpl.Name))
	return s, t.queueAndFree(ctx, &s, holder, waiter, []string{ResourceMPSShares}, nil)
}

// MPSClass is the DeviceClass whose claims Kueue counts as ResourceMPSShares.
func MPSClass(driver string) string { return mpsClassName(driver) }

func mpsClassName(driver string) string {
	for _, c := range deviceclass.Classes {
		if c.DeviceType == vocabulary.KindMPS {
			return c.Name(driver)
		}
	}
	return ""
}

// queueAndFree submits holder, waits until it runs, submits waiter (after
// before, if set), checks that it waits in the queue short of one of want (the
// quota holder uses) with no pod, and that it is admitted and all its pods run
// once holder has finished.
func (t *Team) queueAndFree(ctx context.Context, s *Step, holder, waiter *batchv1.Job, want []string, before func(context.Context) error) error {
	s.Usage = map[string]map[string]int64{}
	jobs := t.C.Client.BatchV1().Jobs(t.Namespace)
	h, err := jobs.Create(ctx, holder, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Job %s: %w", holder.Name, err)
	}
	if err := t.waitAdmitted(ctx, s, h); err != nil {
		return err
	}
	if err := t.waitPodsRunning(ctx, h, false); err != nil {
		return err
	}
	if before != nil {
		if err := before(ctx); err != nil {
			return err
		}
	}
	w, err := jobs.Create(ctx, waiter, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Job %s: %w", waiter.Name, err)
	}
	if err := t.poll(ctx, fmt.Sprintf("Job %s waits in the queue for %v", w.Name, want), func(ctx context.Context) (bool, error) {
		wl, err := t.workloadOf(ctx, w)
		if err != nil || wl == nil {
			return false, err
		}
		status, msg := condition(wl, "QuotaReserved")
		if status == "True" {
			return false, fmt.Errorf("Job %s was admitted while %s held the quota", w.Name, h.Name)
		}
		if status == "False" && WaitsFor(msg, want...) {
			s.Reason = msg
			return true, nil
		}
		return false, nil
	}); err != nil {
		return err
	}
	t.Logf("%s waits in ClusterQueue %s: %s", w.Name, t.Queue, s.Reason)
	if err := t.checkSuspended(ctx, w); err != nil {
		return err
	}
	t.Logf("%s runs its pods; waiting for it to finish", h.Name)
	if err := t.poll(ctx, "Job "+h.Name+" complete", func(ctx context.Context) (bool, error) {
		j, err := jobs.Get(ctx, h.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range j.Status.Conditions {
			if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
				return false, fmt.Errorf("Job %s failed: %s", j.Name, c.Message)
			}
		}
		return j.Status.Succeeded == *j.Spec.Completions, nil
	}); err != nil {
		return err
	}
	if err := t.waitAdmitted(ctx, s, w); err != nil {
		return err
	}
	if err := t.waitPodsRunning(ctx, w, true); err != nil {
		return err
	}
	pods, err := t.jobPods(ctx, w)
	if err != nil {
		return err
	}
	for _, p := range pods {
		s.WaiterPods = append(s.WaiterPods, p.Name)
	}
	t.Logf("%s finished; %s admitted, pods running: %s", h.Name, w.Name, strings.Join(s.WaiterPods, ", "))
	return nil
}

// WaitsFor says whether a Workload's QuotaReserved message is Kueue's for a
// job whose quota is held by others (not one asking more than the quota):
// "insufficient unused quota for <resource> ..." for one of resources.
func WaitsFor(message string, resources ...string) bool {
	for _, r := range resources {
		if strings.Contains(message, "insufficient unused quota for "+r+" ") {
			return true
		}
	}
	return false
}

func (t *Team) waitAdmitted(ctx context.Context, s *Step, j *batchv1.Job) error {
	var wl *unstructured.Unstructured
	if err := t.poll(ctx, "Job "+j.Name+" admitted by Kueue", func(ctx context.Context) (bool, error) {
		var err error
		wl, err = t.workloadOf(ctx, j)
		return err == nil && wl != nil && conditionTrue(wl, "Admitted"), err
	}); err != nil {
		if wl != nil {
			_, msg := condition(wl, "QuotaReserved")
			err = fmt.Errorf("%w (QuotaReserved: %s)", err, msg)
		}
		return err
	}
	u, err := usage(wl)
	if err != nil {
		return err
	}
	s.Usage[j.Name] = u
	t.Logf("%s admitted to %s, holding %v", j.Name, t.Queue, u)
	return nil
}

// checkSuspended: a waiting Job is suspended and has no pods, so nothing of
// it holds a device (the whole gang waits, none of its pods is created).
func (t *Team) checkSuspended(ctx context.Context, j *batchv1.Job) error {
	got, err := t.C.Client.BatchV1().Jobs(j.Namespace).Get(ctx, j.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if got.Spec.Suspend == nil || !*got.Spec.Suspend {
		return fmt.Errorf("Job %s waits in the queue but is not suspended", j.Name)
	}
	pods, err := t.jobPods(ctx, j)
	if err != nil {
		return err
	}
	if len(pods) > 0 {
		return fmt.Errorf("Job %s waits in the queue but has %d pod(s)", j.Name, len(pods))
	}
	return nil
}

func (t *Team) jobPods(ctx context.Context, j *batchv1.Job) ([]corev1.Pod, error) {
	list, err := t.C.Client.CoreV1().Pods(j.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "job=" + j.Name})
	if err != nil {
		return nil, fmt.Errorf("list pods of Job %s: %w", j.Name, err)
	}
	return list.Items, nil
}

// waitPodsRunning waits until all of a Job's parallelism pods run (or, for a
// short job, have run).
func (t *Team) waitPodsRunning(ctx context.Context, j *batchv1.Job, all bool) error {
	want := int(*j.Spec.Parallelism)
	return t.poll(ctx, fmt.Sprintf("%d pod(s) of Job %s running", want, j.Name), func(ctx context.Context) (bool, error) {
		pods, err := t.jobPods(ctx, j)
		if err != nil {
			return false, err
		}
		n := 0
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning || (!all && p.Status.Phase == corev1.PodSucceeded) {
				n++
			}
			if p.Status.Phase == corev1.PodFailed {
				return false, fmt.Errorf("pod %s of Job %s failed: %s", p.Name, j.Name, p.Status.Message)
			}
		}
		return n == want, nil
	})
}

func (t *Team) poll(ctx context.Context, what string, cond wait.ConditionWithContextFunc) error {
	if err := wait.PollUntilContextTimeout(ctx, time.Second, t.Timeout, true, cond); err != nil {
		return fmt.Errorf("waiting for %s: %w", what, err)
	}
	return nil
}

func (t *Team) shortSeconds() int { return max(1, int(t.ShortJob.Seconds())) }

// Cleanup deletes the namespace (its Jobs, and Kueue's Workloads while Kueue
// still runs to remove their finalizers), the queues, the flavor and the
// DeviceClasses Setup created, waiting for each to go.
func (t *Team) Cleanup(ctx context.Context) error {
	var errs []error
	bg := metav1.DeletePropagationBackground
	del := metav1.DeleteOptions{PropagationPolicy: &bg}
	if err := t.C.Client.CoreV1().Namespaces().Delete(ctx, t.Namespace, del); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	errs = append(errs, t.poll(ctx, "namespace "+t.Namespace+" gone", func(ctx context.Context) (bool, error) {
		_, err := t.C.Client.CoreV1().Namespaces().Get(ctx, t.Namespace, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}))
	for _, d := range []struct {
		what string
		del  func() error
		get  func() error
	}{
		{"ClusterQueue " + t.Queue,
			func() error { return t.C.Dynamic.Resource(clusterQueueGVR).Delete(ctx, t.Queue, del) },
			func() error {
				_, err := t.C.Dynamic.Resource(clusterQueueGVR).Get(ctx, t.Queue, metav1.GetOptions{})
				return err
			}},
		{"ResourceFlavor " + flavorName,
			func() error { return t.C.Dynamic.Resource(flavorGVR).Delete(ctx, flavorName, del) },
			func() error {
				_, err := t.C.Dynamic.Resource(flavorGVR).Get(ctx, flavorName, metav1.GetOptions{})
				return err
			}},
	} {
		if err := d.del(); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s: %w", d.what, err))
			continue
		}
		errs = append(errs, t.poll(ctx, d.what+" gone", func(context.Context) (bool, error) { return apierrors.IsNotFound(d.get()), nil }))
	}
	for _, name := range t.createdClasses {
		if err := t.C.Client.ResourceV1().DeviceClasses().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete DeviceClass %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// sanitize makes a profile name part of an object name.
func sanitize(profile string) string {
	return strings.NewReplacer("+", "-", ".", "-").Replace(profile)
}
