package kueue

import (
	"context"
	"fmt"
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	metav1GetOptions    = metav1.GetOptions{}
	metav1DeleteOptions = metav1.DeleteOptions{}
	dryRunCreate        = metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	workloadGVR     = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}
	clusterQueueGVR = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "clusterqueues"}
	localQueueGVR   = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "localqueues"}
	flavorGVR       = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "resourceflavors"}
)

// Quota is a team's nominal quota in its ClusterQueue.
type Quota struct {
	GPUs      int64 // nvidia.com/gpu
	MIG       Cost  // ResourceComputeSlices, ResourceMemorySlices
	MPSShares int64 // ResourceMPSShares
}

// Resources lists the quota as Kueue resource names and amounts, in the
// ClusterQueue's order.
func (q Quota) Resources() [][2]string {
	return [][2]string{
		{"nvidia.com/gpu", strconv.FormatInt(q.GPUs, 10)},
		{ResourceComputeSlices, strconv.FormatInt(q.MIG.ComputeSlices, 10)},
		{ResourceMemorySlices, strconv.FormatInt(q.MIG.MemorySlices, 10)},
		{ResourceMPSShares, strconv.FormatInt(q.MPSShares, 10)},
	}
}

// kueueObject builds an unstructured kueue.x-k8s.io/v1beta2 object.
func kueueObject(kind, namespace, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind,
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
	if namespace != "" {
		u.SetNamespace(namespace)
	}
	return u
}

// clusterQueue is the team's ClusterQueue: one flavor with the whole quota.
func clusterQueue(name, flavor, namespace string, q Quota) *unstructured.Unstructured {
	var covered, resources []any
	for _, r := range q.Resources() {
		covered = append(covered, r[0])
		resources = append(resources, map[string]any{"name": r[0], "nominalQuota": r[1]})
	}
	return kueueObject("ClusterQueue", "", name, map[string]any{
		"namespaceSelector": map[string]any{"matchLabels": map[string]any{corev1.LabelMetadataName: namespace}},
		"queueingStrategy":  "BestEffortFIFO",
		"resourceGroups": []any{map[string]any{
			"coveredResources": covered,
			"flavors":          []any{map[string]any{"name": flavor, "resources": resources}},
		}},
	})
}

// job is a Job of the team's queue: parallelism pods that each get podSpec,
// running sleep seconds.
func job(namespace, name, queue string, parallelism int32, seconds int, spec corev1.PodSpec) *batchv1.Job {
	spec.RestartPolicy = corev1.RestartPolicyNever
	spec.TerminationGracePeriodSeconds = new(int64(1))
	for i := range spec.Containers {
		spec.Containers[i].Command = []string{"sleep", strconv.Itoa(seconds)}
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{QueueNameLabel: queue}},
		Spec: batchv1.JobSpec{
			Parallelism: new(parallelism), Completions: new(parallelism), BackoffLimit: new(int32(0)),
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"job": name}}, Spec: spec},
		},
	}
}

// extendedResourcePod asks for n of an extended resource, as device-plugin
// pods do.
func extendedResourcePod(image, name string, n int64) corev1.PodSpec {
	q := *resource.NewQuantity(n, resource.DecimalSI)
	rl := corev1.ResourceList{corev1.ResourceName(name): q}
	return corev1.PodSpec{Containers: []corev1.Container{{
		Name: "ctr", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
		Resources: corev1.ResourceRequirements{Requests: rl, Limits: rl},
	}}}
}

// claimPod asks for a device by a ResourceClaimTemplate.
func claimPod(image, template string) corev1.PodSpec {
	return corev1.PodSpec{
		ResourceClaims: []corev1.PodResourceClaim{{Name: "dev", ResourceClaimTemplateName: &template}},
		Containers: []corev1.Container{{
			Name: "ctr", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "dev"}}},
		}},
	}
}

// mpsTemplate is a claim template for one MPS share with its capacity.
func mpsTemplate(namespace, name, class string, compute, memory string) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "mps", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: class,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					"compute": resource.MustParse(compute), "memory": resource.MustParse(memory),
				}},
			}}},
		}}},
	}
}

// workloadOf finds the Kueue Workload of a Job (the one it owns).
func (t *Team) workloadOf(ctx context.Context, j *batchv1.Job) (*unstructured.Unstructured, error) {
	list, err := t.C.Dynamic.Resource(workloadGVR).Namespace(j.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Kueue Workloads in %s: %w", j.Namespace, err)
	}
	for i := range list.Items {
		for _, o := range list.Items[i].GetOwnerReferences() {
			if o.UID == j.UID {
				return &list.Items[i], nil
			}
		}
	}
	return nil, nil
}

// condition returns a status condition's status and message.
func condition(u *unstructured.Unstructured, typ string) (status, message string) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if ok && m["type"] == typ {
			s, _ := m["status"].(string)
			msg, _ := m["message"].(string)
			return s, msg
		}
	}
	return "", ""
}

func conditionTrue(u *unstructured.Unstructured, typ string) bool {
	s, _ := condition(u, typ)
	return s == "True"
}

// usage is the quota an admitted Workload holds: its first pod set's
// resourceUsage, as integers.
func usage(u *unstructured.Unstructured) (map[string]int64, error) {
	sets, _, _ := unstructured.NestedSlice(u.Object, "status", "admission", "podSetAssignments")
	if len(sets) == 0 {
		return nil, fmt.Errorf("Workload %s/%s: no status.admission.podSetAssignments", u.GetNamespace(), u.GetName())
	}
	ru, _, _ := unstructured.NestedStringMap(sets[0].(map[string]any), "resourceUsage")
	out := map[string]int64{}
	for k, v := range ru {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("Workload %s/%s: resourceUsage %s: %w", u.GetNamespace(), u.GetName(), k, err)
		}
		out[k] = q.Value()
	}
	return out, nil
}
