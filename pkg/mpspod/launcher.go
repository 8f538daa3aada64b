// Package mpspod runs MPS control daemons as pods on the plugin's node.
//
// A daemon the plugin starts as its own process lives in the plugin
// container's cgroup, and the container runtime kills every process of that
// cgroup when the plugin's container stops: a plugin restart or upgrade
// would take the MPS server away from running CUDA processes. A pod of its
// own survives the plugin. The plugin still talks to the daemon only
// through the pipe directory (host paths shared by both pods) and its PID,
// which it can see and signal because both pods use the host's PID
// namespace.
package mpspod

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/sharing"
)

// Component is the app.kubernetes.io/component label of daemon pods.
const Component = "mps-control-daemon"

// Options configure a Launcher.
type Options struct {
	Client kubernetes.Interface
	// Namespace gets the pods, normally the plugin's own.
	Namespace string
	// NodeName is the plugin's node; pods are bound to it directly.
	NodeName string
	// DriverName prefixes the label that names a pod's device.
	DriverName string
	// Image runs the control program: normally the plugin's own image,
	// which has the simulated one and the mount points of Mounts.
	Image           string
	ImagePullPolicy corev1.PullPolicy
	// Owner, when set, owns every pod, so that the pods are garbage
	// collected with it (the plugin's DaemonSet: uninstalling the driver
	// removes its daemons, restarting the plugin does not).
	Owner *metav1.OwnerReference
	// Budget, when set, is the pods' controller: the PodDisruptionBudget
	// that refuses every eviction of a daemon (BudgetOf), so that `kubectl
	// drain` evicts the daemons' clients, not the daemons, without --force
	// (drain refuses pods without a controller). The plugin deletes a
	// daemon's pod itself once its last client's claim is unprepared, so
	// the daemon goes after its clients (docs/operations.md, "Drain").
	Budget *metav1.OwnerReference
	// PriorityClassName of the pods, e.g. system-node-critical.
	PriorityClassName string
	// ServiceAccountName of the pods: one without permissions (no token
	// is mounted either); empty means the namespace's default.
	ServiceAccountName string
	// Mounts are bind-mounted into the daemon container besides its pipe
	// and log directories.
	Mounts []cdi.Mount
}

// Launcher implements sharing.DaemonLauncher with pods.
type Launcher struct {
	opts Options
}

var (
	_ sharing.DaemonLauncher  = (*Launcher)(nil)
	_ sharing.DaemonInspector = (*Launcher)(nil)
	_ sharing.DaemonPruner    = (*Launcher)(nil)
)

// New returns a Launcher.
func New(opts Options) (*Launcher, error) {
	switch {
	case opts.Client == nil:
		return nil, errors.New("MPS daemon pods: no API client")
	case opts.Namespace == "":
		return nil, errors.New("MPS daemon pods: no namespace")
	case opts.NodeName == "":
		return nil, errors.New("MPS daemon pods: no node name")
	case opts.Image == "":
		return nil, errors.New("MPS daemon pods: no image")
	case opts.DriverName == "":
		return nil, errors.New("MPS daemon pods: no driver name")
	}
	if opts.ImagePullPolicy == "" {
		opts.ImagePullPolicy = corev1.PullIfNotPresent
	}
	return &Launcher{opts: opts}, nil
}

// deviceLabel names the device directory (sharing.Daemon.Name) a pod
// serves.
func (l *Launcher) deviceLabel() string { return l.opts.DriverName + "/mps-daemon" }

// Launch implements sharing.DaemonLauncher: it removes the device's earlier
// pods (their daemons have exited or been stopped) and creates a new one
// running `<binary> -f`. The manager waits for the control socket.
func (l *Launcher) Launch(ctx context.Context, d sharing.Daemon) error {
	if err := l.Cleanup(ctx, d); err != nil {
		return err
	}
	pod := l.pod(d)
	created, err := l.opts.Client.CoreV1().Pods(l.opts.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create MPS control daemon pod for %s: %w", d.Name, err)
	}
	klog.FromContext(ctx).V(2).Info("Created MPS control daemon pod", "pod", klog.KObj(created), "daemon", d.Name)
	return nil
}

// Cleanup implements sharing.DaemonLauncher: it deletes the device's pods
// on this node.
func (l *Launcher) Cleanup(ctx context.Context, d sharing.Daemon) error {
	return l.deletePods(ctx, func(name string) bool { return name == d.Name })
}

// Prune deletes the node's daemon pods of devices not in keep: pods of a
// crashed teardown, or of a directory removed by hand.
func (l *Launcher) Prune(ctx context.Context, keep []string) error {
	return l.deletePods(ctx, func(name string) bool { return !slices.Contains(keep, name) })
}

// pods lists this node's daemon pods of the daemons match accepts.
func (l *Launcher) pods(ctx context.Context, match func(daemon string) bool) ([]corev1.Pod, error) {
	selector := labels.SelectorFromSet(labels.Set{"app.kubernetes.io/component": Component})
	list, err := l.opts.Client.CoreV1().Pods(l.opts.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: selector.String(),
		FieldSelector: "spec.nodeName=" + l.opts.NodeName,
	})
	if err != nil {
		return nil, fmt.Errorf("list MPS control daemon pods: %w", err)
	}
	var out []corev1.Pod
	for _, pod := range list.Items {
		if name, ok := pod.Labels[l.deviceLabel()]; ok && pod.Spec.NodeName == l.opts.NodeName && match(name) {
			out = append(out, pod)
		}
	}
	return out, nil
}

// Inspect implements sharing.DaemonInspector: the state of the daemon's
// pod, fatal when the pod ended or its container cannot be created.
func (l *Launcher) Inspect(ctx context.Context, d sharing.Daemon) (string, bool) {
	pods, err := l.pods(ctx, func(name string) bool { return name == d.Name })
	// An earlier daemon's pod that Launch deleted may still be terminating
	// (Succeeded until the kubelet is done with it): it is not this daemon,
	// and the API server lists pods by name, not by age.
	pods = slices.DeleteFunc(pods, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
	switch {
	case err != nil:
		return err.Error(), false
	case len(pods) == 0:
		return "its pod is gone", true
	}
	pod := &pods[len(pods)-1]
	status := fmt.Sprintf("pod %s/%s is %s", pod.Namespace, pod.Name, cmp.Or(string(pod.Status.Phase), "not yet seen by the kubelet"))
	fatal := pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded
	if pod.Status.Reason != "" {
		status += ": " + pod.Status.Reason + " " + pod.Status.Message
	}
	for _, c := range pod.Status.ContainerStatuses {
		switch st := c.State; {
		case st.Waiting != nil && st.Waiting.Reason != "":
			status += fmt.Sprintf(", container waiting: %s %s", st.Waiting.Reason, st.Waiting.Message)
			fatal = fatal || slices.Contains(hopelessWaits, st.Waiting.Reason)
		case st.Terminated != nil:
			status += fmt.Sprintf(", container exited with %d: %s %s", st.Terminated.ExitCode, st.Terminated.Reason, st.Terminated.Message)
		}
	}
	return strings.TrimSpace(status), fatal
}

// hopelessWaits are container waiting reasons that no retry within a
// prepare call fixes.
var hopelessWaits = []string{"InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}

func (l *Launcher) deletePods(ctx context.Context, match func(daemon string) bool) error {
	logger := klog.FromContext(ctx)
	pods, err := l.pods(ctx, match)
	if err != nil {
		return err
	}
	var errs []error
	for _, pod := range pods {
		name := pod.Labels[l.deviceLabel()]
		err := l.opts.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &pod.UID},
		})
		switch {
		case err == nil:
			logger.V(2).Info("Deleted MPS control daemon pod", "pod", klog.KObj(&pod), "daemon", name, "phase", pod.Status.Phase)
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		default:
			errs = append(errs, fmt.Errorf("delete MPS control daemon pod %s: %w", pod.Name, err))
		}
	}
	return errors.Join(errs...)
}

// pod is the daemon's pod: bound to the node, in the host's PID namespace
// (the plugin signals the PID the daemon writes), privileged for the GPU's
// device nodes, not restarted by the kubelet (the plugin restarts a dead
// daemon after cleaning its pipe directory).
func (l *Launcher) pod(d sharing.Daemon) *corev1.Pod {
	var env []corev1.EnvVar
	hasPath := false
	for _, kv := range d.Env {
		name, value, _ := strings.Cut(kv, "=")
		hasPath = hasPath || name == "PATH"
		env = append(env, corev1.EnvVar{Name: name, Value: value})
	}
	if !hasPath {
		// The control daemon starts nvidia-cuda-mps-server from its PATH.
		env = append(env, corev1.EnvVar{Name: "PATH", Value: filepath.Dir(d.Binary) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
	}
	mounts := append([]cdi.Mount{{HostPath: d.HostPipeDir, ContainerPath: d.PipeDir}, {HostPath: d.HostLogDir, ContainerPath: d.LogDir}}, l.opts.Mounts...)
	if d.HostShmDir != "" {
		// The tmpfs the daemon's clients see at /dev/shm too.
		mounts = append(mounts, cdi.Mount{HostPath: d.HostShmDir, ContainerPath: "/dev/shm"})
	}
	var volumes []corev1.Volume
	var volumeMounts []corev1.VolumeMount
	for i, m := range mounts {
		name := fmt.Sprintf("host-%d", i)
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: m.HostPath, Type: ptr.To(corev1.HostPathDirectory)},
		}})
		// No mount propagation: a daemon starts when the driver already
		// answers NVML, and propagation needs a shared host mount.
		volumeMounts = append(volumeMounts, corev1.VolumeMount{Name: name, MountPath: m.ContainerPath, ReadOnly: m.ReadOnly})
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "mps-" + d.Name + "-",
			Namespace:    l.opts.Namespace,
			Labels: map[string]string{
				"app.kubernetes.io/component":  Component,
				"app.kubernetes.io/managed-by": "dra-kubelet-plugin",
				l.deviceLabel():                d.Name,
			},
			Annotations: map[string]string{l.opts.DriverName + "/device": d.Device.UUID},
		},
		Spec: corev1.PodSpec{
			NodeName:                      l.opts.NodeName,
			HostPID:                       true,
			RestartPolicy:                 corev1.RestartPolicyNever,
			PriorityClassName:             l.opts.PriorityClassName,
			ServiceAccountName:            l.opts.ServiceAccountName,
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](10),
			// Wherever the plugin runs, so must its daemons, tainted GPUs included.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name:            "mps-control",
				Image:           l.opts.Image,
				ImagePullPolicy: l.opts.ImagePullPolicy,
				Command:         []string{d.Binary, "-f"},
				Env:             env,
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
				VolumeMounts:    volumeMounts,
			}},
			Volumes: volumes,
		},
	}
	for _, ref := range []*metav1.OwnerReference{l.opts.Owner, l.opts.Budget} {
		if ref != nil {
			pod.OwnerReferences = append(pod.OwnerReferences, *ref)
		}
	}
	return pod
}

// BudgetOf returns the PodDisruptionBudget that guards daemon pods as
// their controller reference (Options.Budget). Not a DaemonSet: the
// DaemonSet controller deletes pods it controls beyond one per node and
// releases those its selector does not match. The garbage collector
// removes a pod when all its owners are gone, so daemons still go with the
// plugin's DaemonSet when the budget goes with the release.
func BudgetOf(ctx context.Context, client kubernetes.Interface, namespace, name string) (*metav1.OwnerReference, error) {
	pdb, err := client.PolicyV1().PodDisruptionBudgets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get the MPS daemons' PodDisruptionBudget %s/%s: %w", namespace, name, err)
	}
	return &metav1.OwnerReference{
		APIVersion: "policy/v1", Kind: "PodDisruptionBudget", Name: pdb.Name, UID: pdb.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(false),
	}, nil
}

// OwnerOf returns the controller of the plugin's own pod (its DaemonSet) as
// an owner reference for daemon pods: not their controller, and not
// blocking the owner's deletion.
func OwnerOf(ctx context.Context, client kubernetes.Interface, namespace, podName string) (*metav1.OwnerReference, error) {
	pod, err := client.CoreV1().Pods(namespace).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get the plugin's pod %s/%s: %w", namespace, podName, err)
	}
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return nil, fmt.Errorf("the plugin's pod %s/%s has no controller", namespace, podName)
	}
	owner := *ref
	owner.Controller, owner.BlockOwnerDeletion = nil, nil
	return &owner, nil
}
