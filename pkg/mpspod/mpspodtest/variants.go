// Package mpspodtest holds what tests of the MPS daemon pod admission policy
// share: the variants of the launcher's pod that the policy must deny. The
// unit test of pkg/mpspod evaluates the chart's policy with the API server's
// CEL libraries; test/e2e asks a real API server.
package mpspodtest

import (
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// Variant changes the launcher's pod into one the policy must deny, with a
// message containing Want.
type Variant struct {
	Mutate func(*corev1.Pod)
	Want   string
}

// ForbiddenVariants are the ways a compromised node could try to get more
// from a daemon pod than pkg/mpspod's pod: credentials the kubelet would
// fetch for it (service account tokens, Secrets, ConfigMaps, pull
// secrets), other host paths, other programs, host namespaces. good is the
// launcher's pod: one container with the pipe directory as its first
// volume and mount; otherSA is an existing service account with
// permissions, e.g. the plugin's own. Each variant fails the policy's
// validation that names it first (the API server reports only the first).
func ForbiddenVariants(good *corev1.Pod, otherSA string) map[string]Variant {
	secretVolume := corev1.Volume{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "webhook-tls"}}}
	tokenVolume := corev1.Volume{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
		{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
	}}}}
	configMapVolume := corev1.Volume{Name: "cm", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
	}}}
	hostPath := func(path string) corev1.Volume {
		return corev1.Volume{Name: "extra", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: ptr.To(corev1.HostPathDirectory)}}}
	}
	mount := func(pod *corev1.Pod, v corev1.Volume, at string) {
		pod.Spec.Volumes = append(pod.Spec.Volumes, v)
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: at})
	}
	c := func(pod *corev1.Pod) *corev1.Container { return &pod.Spec.Containers[0] }
	pipe := good.Spec.Volumes[0].HostPath.Path
	exec := &corev1.ExecAction{Command: []string{"/bin/sh", "-c", "cat /var/run/secrets/*"}}
	secretEnv := corev1.EnvVar{Name: "KEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "webhook-tls"}, Key: "tls.key",
	}}}
	return map[string]Variant{
		"not a daemon pod": {func(p *corev1.Pod) { delete(p.Labels, "app.kubernetes.io/component") }, "only manage MPS control daemon pods"},
		"another image":    {func(p *corev1.Pod) { c(p).Image = "registry.example/miner:latest" }, "the driver's image"},
		// Any tag of the driver's repository is admitted (rolling upgrades),
		// not a repository whose name only starts the same.
		"a repository named like the driver's": {func(p *corev1.Pod) {
			repo, tag := splitImage(c(p).Image)
			c(p).Image = repo + "-evil" + tag
		}, "the driver's image"},
		"a second container": {func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, *c(p))
			p.Spec.Containers[1].Name = "two"
		}, "exactly one container"},
		"an init container": {func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{*c(p)}
			p.Spec.InitContainers[0].Name = "init"
		}, "exactly one container"},
		"another command": {func(p *corev1.Pod) { c(p).Command = []string{"/bin/sh", "-c", "sleep inf"} }, "must run only"},
		"arguments":       {func(p *corev1.Pod) { c(p).Args = []string{"-x"} }, "must run only"},
		"a postStart hook": {func(p *corev1.Pod) {
			c(p).Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: exec}}
		}, "must run only"},
		"an exec probe":       {func(p *corev1.Pod) { c(p).LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: exec}} }, "must run only"},
		"a host port":         {func(p *corev1.Pod) { c(p).Ports = []corev1.ContainerPort{{ContainerPort: 22, HostPort: 22}} }, "must run only"},
		"a working directory": {func(p *corev1.Pod) { c(p).WorkingDir = "/tmp" }, "must run only"},
		"another service account": {func(p *corev1.Pod) {
			p.Spec.ServiceAccountName, p.Spec.DeprecatedServiceAccount = otherSA, otherSA
		}, "must run as service account"},
		"the default service account": {func(p *corev1.Pod) {
			p.Spec.ServiceAccountName, p.Spec.DeprecatedServiceAccount = "default", "default"
		}, "must run as service account"},
		"a mounted token":           {func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = ptr.To(true) }, "automountServiceAccountToken: false"},
		"a defaulted token":         {func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = nil }, "automountServiceAccountToken: false"},
		"the webhook's TLS secret":  {func(p *corev1.Pod) { mount(p, secretVolume, "/tls") }, "only have hostPath volumes"},
		"a projected token":         {func(p *corev1.Pod) { mount(p, tokenVolume, "/token") }, "only have hostPath volumes"},
		"a ConfigMap":               {func(p *corev1.Pod) { mount(p, configMapVolume, "/cm") }, "only have hostPath volumes"},
		"the host's root":           {func(p *corev1.Pod) { mount(p, hostPath("/"), "/host") }, "only have hostPath volumes"},
		"the kubelet's credentials": {func(p *corev1.Pod) { mount(p, hostPath("/var/lib/kubelet/pki"), "/pki") }, "only have hostPath volumes"},
		"an MPS dir's sibling":      {func(p *corev1.Pod) { mount(p, hostPath(filepath.Dir(pipe)+"/state.json"), "/s") }, "only have hostPath volumes"},
		"a created host dir":        {func(p *corev1.Pod) { p.Spec.Volumes[0].HostPath.Type = ptr.To(corev1.HostPathDirectoryOrCreate) }, "only have hostPath volumes"},
		"the pipe dir over the program": {func(p *corev1.Pod) {
			c(p).VolumeMounts[0].MountPath = filepath.Dir(c(p).Command[0])
		}, "mount each directory where the plugin sees it"},
		"a subPath":                {func(p *corev1.Pod) { c(p).VolumeMounts[0].SubPath = "x" }, "without subPath"},
		"an env var from a Secret": {func(p *corev1.Pod) { c(p).Env = append(c(p).Env, secretEnv) }, "only have literal environment"},
		"env from a Secret": {func(p *corev1.Pod) {
			c(p).EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "webhook-tls"}}}}
		}, "only have literal environment"},
		"the host network":       {func(p *corev1.Pod) { p.Spec.HostNetwork = true }, "host network"},
		"the host IPC namespace": {func(p *corev1.Pod) { p.Spec.HostIPC = true }, "host network or IPC"},
		"an image pull secret":   {func(p *corev1.Pod) { p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "webhook-tls"}} }, "image pull"},
		"a resource claim": {func(p *corev1.Pod) {
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("someone-elses-claim")}}
		}, "resource claims"},
		"another priority class": {func(p *corev1.Pod) { p.Spec.PriorityClassName, p.Spec.Priority = "system-cluster-critical", nil }, "priority class"},
		"mount propagation": {func(p *corev1.Pod) {
			c(p).VolumeMounts[0].MountPropagation = ptr.To(corev1.MountPropagationBidirectional)
		}, "without subPath or mount propagation"},
		"capabilities": {func(p *corev1.Pod) {
			c(p).SecurityContext.Capabilities = &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}
		}, "exactly the security context"},
		"another user":   {func(p *corev1.Pod) { c(p).SecurityContext.RunAsUser = ptr.To[int64](1000) }, "exactly the security context"},
		"not privileged": {func(p *corev1.Pod) { c(p).SecurityContext = nil }, "exactly the security context"},
		"sysctls": {func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "kernel.shm_rmid_forced", Value: "0"}}}
		}, "exactly the security context"},
	}
}

// splitImage splits an image reference into its repository and the rest
// (":tag", "@digest" or both).
func splitImage(image string) (repo, rest string) {
	name := image
	if i := strings.Index(name, "@"); i >= 0 {
		name = name[:i]
	}
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	return name, image[len(name):]
}
