package mpspod

import (
	"cmp"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/sharing"
)

const (
	release     = "rel"
	chartImage  = "registry.example/gpu-dra-driver:v9"
	pluginUser  = "system:serviceaccount:" + namespace + ":rel-gpu-dra-driver-kubelet-plugin"
	daemonSA    = "rel-gpu-dra-driver-mps-daemon"
	nodeNameKey = "authentication.kubernetes.io/node-name"
)

// TestDaemonPodPolicy evaluates the chart's MPS daemon pod admission policy
// with the API server's own CEL compiler and validator: the pod this launcher
// builds for the daemon a real MPSManager asks for is admitted; every variant
// that would give a compromised node more than that pod (another service
// account, a token, Secrets, other host paths, another command, ...) is
// denied with a message that says why. test/e2e's TestMPSDaemonPodPolicy
// does the same against a real API server.
func TestDaemonPodPolicy(t *testing.T) {
	for name, tc := range map[string]struct {
		values     []string
		driverRoot Mount
		control    string
	}{
		"host driver": {
			driverRoot: Mount{HostPath: "/run/nvidia/driver", Path: "/driver-root"},
			control:    "/driver-root/usr/bin/nvidia-cuda-mps-control",
		},
		"simulated": {
			values:  []string{"--set", "simulate=dgxh100"},
			control: "/usr/bin/mps-control-sim",
		},
	} {
		t.Run(name, func(t *testing.T) {
			kubeletDir := shortTempDir(t)
			dataDir := filepath.Join(kubeletDir, "plugins/gpu.dra.dev")
			if tc.driverRoot.HostPath == "" {
				root := filepath.Join(dataDir, "simulated-dgxh100/driver-root")
				tc.driverRoot = Mount{HostPath: root, Path: root}
			}
			policy := chartPolicy(t, append([]string{"--set", "kubeletDir=" + kubeletDir}, tc.values...)...)
			validator := compilePolicy(t, policy)
			pod := launcherPod(t, filepath.Join(dataDir, "mps"), tc.control, tc.driverRoot)
			checkPolicy(t, validator, pod)
		})
	}
}

// checkPolicy runs the allowed pod and its forbidden variants through the
// policy.
func checkPolicy(t *testing.T, v *policy, good *corev1.Pod) {
	if msg := admit(t, v, admission.Create, good, nodeUser(node)); msg != "" {
		t.Fatalf("the launcher's pod is denied: %s\n%s", msg, toYAML(t, good))
	}
	if msg := admit(t, v, admission.Delete, good, nodeUser(node)); msg != "" {
		t.Errorf("deleting the launcher's pod is denied: %s", msg)
	}
	if msg := admit(t, v, admission.Create, good, nodeUser("other-node")); !strings.Contains(msg, "own node") {
		t.Errorf("a plugin of another node creates the pod: %q", msg)
	}
	if msg := admit(t, v, admission.Create, good, &user.DefaultInfo{Name: pluginUser}); !strings.Contains(msg, "own node") {
		t.Errorf("a credential without node creates the pod: %q", msg)
	}
	secretVolume := corev1.Volume{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "rel-gpu-dra-driver-webhook-tls"}}}
	tokenVolume := corev1.Volume{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
		{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
	}}}}
	hostPath := func(path string, typ corev1.HostPathType) corev1.Volume {
		return corev1.Volume{Name: "extra", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &typ}}}
	}
	mount := func(pod *corev1.Pod, v corev1.Volume, at string) {
		pod.Spec.Volumes = append(pod.Spec.Volumes, v)
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: at})
	}
	c := func(pod *corev1.Pod) *corev1.Container { return &pod.Spec.Containers[0] }
	pipe := good.Spec.Volumes[0].HostPath.Path
	exec := &corev1.ExecAction{Command: []string{"/bin/sh", "-c", "cat /var/run/secrets/*"}}
	variants := map[string]struct {
		mutate func(*corev1.Pod)
		want   string
	}{
		"not a daemon pod":       {func(p *corev1.Pod) { p.Labels = nil }, "only manage MPS control daemon pods"},
		"another image":          {func(p *corev1.Pod) { c(p).Image = "registry.example/miner:latest" }, "the driver's image"},
		"a second container":     {func(p *corev1.Pod) { p.Spec.Containers = append(p.Spec.Containers, *c(p)) }, "exactly one container"},
		"an init container":      {func(p *corev1.Pod) { p.Spec.InitContainers = []corev1.Container{*c(p)} }, "exactly one container"},
		"an ephemeral container": {func(p *corev1.Pod) { p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{}} }, "exactly one container"},
		"another command":        {func(p *corev1.Pod) { c(p).Command = []string{"/bin/sh", "-c", "sleep inf"} }, "must run only"},
		"no command":             {func(p *corev1.Pod) { c(p).Command = nil }, "must run only"},
		"arguments":              {func(p *corev1.Pod) { c(p).Args = []string{"-x"} }, "must run only"},
		"a postStart hook": {func(p *corev1.Pod) {
			c(p).Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: exec}}
		}, "must run only"},
		"an exec probe":             {func(p *corev1.Pod) { c(p).LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: exec}} }, "must run only"},
		"a host port":               {func(p *corev1.Pod) { c(p).Ports = []corev1.ContainerPort{{ContainerPort: 22, HostPort: 22}} }, "must run only"},
		"a working directory":       {func(p *corev1.Pod) { c(p).WorkingDir = "/tmp" }, "must run only"},
		"the controller's account":  {func(p *corev1.Pod) { p.Spec.ServiceAccountName = "rel-gpu-dra-driver-controller" }, "must run as service account " + daemonSA},
		"the default account":       {func(p *corev1.Pod) { p.Spec.ServiceAccountName = "" }, "must run as service account"},
		"a mounted token":           {func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = ptr.To(true) }, "automountServiceAccountToken: false"},
		"a defaulted token":         {func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = nil }, "automountServiceAccountToken: false"},
		"the webhook's TLS secret":  {func(p *corev1.Pod) { mount(p, secretVolume, "/tls") }, "only have hostPath volumes"},
		"a projected token":         {func(p *corev1.Pod) { mount(p, tokenVolume, "/token") }, "only have hostPath volumes"},
		"a ConfigMap":               {func(p *corev1.Pod) { mount(p, configMapVolume(), "/cm") }, "only have hostPath volumes"},
		"the host's root":           {func(p *corev1.Pod) { mount(p, hostPath("/", corev1.HostPathDirectory), "/host") }, "only have hostPath volumes"},
		"the kubelet's credentials": {func(p *corev1.Pod) { mount(p, hostPath("/var/lib/kubelet/pki", corev1.HostPathDirectory), "/pki") }, "only have hostPath volumes"},
		"an MPS dir's sibling": {func(p *corev1.Pod) {
			mount(p, hostPath(filepath.Dir(pipe)+"/state.json", corev1.HostPathDirectory), "/s")
		}, "only have hostPath volumes"},
		"a path that climbs out": {func(p *corev1.Pod) {
			mount(p, hostPath(pipe+"/../../../../pki/x/pipe", corev1.HostPathDirectory), "/s")
		}, "only have hostPath volumes"},
		"a created host dir": {func(p *corev1.Pod) { p.Spec.Volumes[0].HostPath.Type = ptr.To(corev1.HostPathDirectoryOrCreate) }, "only have hostPath volumes"},
		"a pipe dir over the program": {func(p *corev1.Pod) {
			c(p).VolumeMounts[0].MountPath = filepath.Dir(c(p).Command[0])
		}, "mount each directory where the plugin sees it"},
		"a subPath": {func(p *corev1.Pod) { c(p).VolumeMounts[0].SubPath = "x" }, "without subPath"},
		"mount propagation": {func(p *corev1.Pod) {
			c(p).VolumeMounts[0].MountPropagation = ptr.To(corev1.MountPropagationBidirectional)
		}, "without subPath or mount propagation"},
		"an env var from a Secret": {func(p *corev1.Pod) { c(p).Env = append(c(p).Env, secretEnv()) }, "only have literal environment"},
		"env from a Secret": {func(p *corev1.Pod) {
			c(p).EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}}}}
		}, "only have literal environment"},
		"the host network":       {func(p *corev1.Pod) { p.Spec.HostNetwork = true }, "host network"},
		"the host IPC namespace": {func(p *corev1.Pod) { p.Spec.HostIPC = true }, "host network or IPC"},
		"an image pull secret":   {func(p *corev1.Pod) { p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "s"}} }, "image pull"},
		"a resource claim":       {func(p *corev1.Pod) { p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu"}} }, "resource claims"},
		"a runtime class":        {func(p *corev1.Pod) { p.Spec.RuntimeClassName = ptr.To("kata") }, "runtime class"},
		"another priority class": {func(p *corev1.Pod) { p.Spec.PriorityClassName = "system-cluster-critical" }, "priority class"},
		"capabilities":           {func(p *corev1.Pod) { c(p).SecurityContext.Capabilities = &corev1.Capabilities{} }, "exactly the security context"},
		"another user":           {func(p *corev1.Pod) { c(p).SecurityContext.RunAsUser = ptr.To[int64](1000) }, "exactly the security context"},
		"no security context":    {func(p *corev1.Pod) { c(p).SecurityContext = nil }, "exactly the security context"},
		"sysctls": {func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "a", Value: "b"}}}
		}, "exactly the security context"},
		"a pod-level seccomp profile": {func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{}}
		}, "exactly the security context"},
	}
	for name, tc := range variants {
		t.Run(name, func(t *testing.T) {
			pod := good.DeepCopy()
			tc.mutate(pod)
			msg := admit(t, v, admission.Create, pod, nodeUser(node))
			switch {
			case msg == "":
				t.Errorf("admitted, want denied with %q", tc.want)
			case !strings.Contains(msg, tc.want):
				t.Errorf("denied with %q, want %q", msg, tc.want)
			}
		})
	}
}

func configMapVolume() corev1.Volume {
	return corev1.Volume{Name: "cm", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}}}}
}

func secretEnv() corev1.EnvVar {
	return corev1.EnvVar{Name: "KEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "rel-gpu-dra-driver-webhook-tls"}, Key: "tls.key",
	}}}
}

func nodeUser(node string) user.Info {
	return &user.DefaultInfo{Name: pluginUser, Extra: map[string][]string{nodeNameKey: {node}}}
}

// shortTempDir is a temporary directory with a short path: MPS sockets live
// below it.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vap")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// chartPolicy renders the chart's MPS daemon pod policy with helm ($HELM or
// helm on PATH; hack/cluster builds one).
func chartPolicy(t *testing.T, values ...string) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	helm := os.Getenv("HELM")
	if helm == "" {
		var err error
		if helm, err = exec.LookPath("helm"); err != nil {
			t.Skip("SKIP: no helm ($HELM or on PATH) to render the chart's admission policy; hack/cluster/build.sh builds one")
		}
	}
	args := append([]string{"template", release, "../../deployments/helm/gpu-dra-driver", "-n", namespace,
		"--show-only", "templates/validatingadmissionpolicy.yaml",
		"--set", "image.repository=registry.example/gpu-dra-driver,image.tag=v9"}, values...)
	out, err := exec.Command(helm, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var vap admissionregistrationv1.ValidatingAdmissionPolicy
		if err := yaml.UnmarshalStrict([]byte(doc), &vap); err != nil || vap.Kind != "ValidatingAdmissionPolicy" {
			continue
		}
		if strings.HasSuffix(vap.Name, "-mps-daemon-pods") {
			return &vap
		}
	}
	t.Fatalf("the chart renders no MPS daemon pod policy:\n%s", out)
	return nil
}

// policy is a compiled ValidatingAdmissionPolicy.
type policy struct {
	spec                  *admissionregistrationv1.ValidatingAdmissionPolicy
	match                 matchconditions.Matcher
	validations, messages plugincel.ConditionEvaluator
}

// compilePolicy compiles a policy as the API server's ValidatingAdmissionPolicy
// plugin does (validating.compilePolicy, whose package would pull its
// tracing dependencies into go.mod): variables composited, an authorizer
// declared, new expressions (the strict checks for a policy being created).
func compilePolicy(t *testing.T, p *admissionregistrationv1.ValidatingAdmissionPolicy) *policy {
	t.Helper()
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	vars := plugincel.OptionalVariableDeclarations{HasAuthorizer: true}
	var named []plugincel.NamedExpressionAccessor
	for _, v := range p.Spec.Variables {
		named = append(named, &expression{name: v.Name, expr: v.Expression, types: []*cel.Type{cel.AnyType, cel.DynType}})
	}
	compiler.CompileAndStoreVariables(named, vars, environment.NewExpressions)
	var conds []plugincel.ExpressionAccessor
	for i := range p.Spec.MatchConditions {
		conds = append(conds, ptr.To(matchconditions.MatchCondition(p.Spec.MatchConditions[i])))
	}
	validations := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	for i, v := range p.Spec.Validations {
		validations[i] = &expression{expr: v.Expression, types: []*cel.Type{cel.BoolType}}
		messages[i] = &expression{expr: cmp.Or(v.MessageExpression, "''"), types: []*cel.Type{cel.StringType}}
	}
	pol := &policy{
		spec:        p,
		match:       matchconditions.NewMatcher(compiler.CompileCondition(conds, vars, environment.NewExpressions), p.Spec.FailurePolicy, "policy", "validate", p.Name),
		validations: compiler.CompileCondition(validations, vars, environment.NewExpressions),
		messages:    compiler.CompileCondition(messages, plugincel.OptionalVariableDeclarations{}, environment.NewExpressions),
	}
	for _, errs := range [][]error{pol.validations.CompilationErrors(), pol.messages.CompilationErrors()} {
		for _, err := range errs {
			t.Errorf("policy %s: %v", p.Name, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return pol
}

// expression is a CEL expression of a policy, named for variables.
type expression struct {
	name, expr string
	types      []*cel.Type
}

func (e *expression) GetExpression() string    { return e.expr }
func (e *expression) ReturnTypes() []*cel.Type { return e.types }
func (e *expression) GetName() string          { return e.name }

// admit returns "" when the policy admits the operation on pod by u, else
// the messages of the validations that failed. An evaluation error fails the
// test: under failurePolicy Fail it would deny with an unreadable message.
func admit(t *testing.T, p *policy, op admission.Operation, pod *corev1.Pod, u user.Info) string {
	t.Helper()
	gvk := schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	obj, old := runtime.Object(pod), runtime.Object(nil)
	if op == admission.Delete {
		obj, old = nil, pod
	}
	attrs := admission.NewAttributesRecord(obj, old, gvk, pod.Namespace, pod.Name, gvr, "", op, nil, false, u)
	versioned := &admission.VersionedAttributes{Attributes: attrs, VersionedKind: gvk, VersionedObject: admission.NewLazyObject(obj), VersionedOldObject: admission.NewLazyObject(old)}
	ctx := context.Background()
	if m := p.match.Match(ctx, versioned, nil, nil); m.Error != nil || !m.Matches {
		t.Fatalf("policy does not match the plugin's request: %+v", m)
	}
	request := plugincel.CreateAdmissionRequest(attrs, metav1.GroupVersionResource(gvr), metav1.GroupVersionKind(gvk))
	results, _, err := p.validations.ForInput(ctx, versioned, request, plugincel.OptionalVariableBindings{}, nil, celconfig.RuntimeCELCostBudget)
	if err != nil {
		t.Fatal(err)
	}
	messages, _, err := p.messages.ForInput(ctx, versioned, request, plugincel.OptionalVariableBindings{}, nil, celconfig.RuntimeCELCostBudget)
	if err != nil {
		t.Fatal(err)
	}
	var denied []string
	for i, r := range results {
		switch {
		case r.Error != nil:
			t.Errorf("validation %d: evaluation error: %v", i, r.Error)
		case r.EvalResult != types.True:
			msg := p.spec.Spec.Validations[i].Message
			if s, ok := messages[i].EvalResult.Value().(string); ok && s != "" {
				msg = s
			}
			denied = append(denied, msg)
		}
	}
	return strings.Join(denied, "; ")
}

// launcherPod is the pod the launcher creates for the daemon a real
// MPSManager asks for, with the plugin's options as pkg/app sets them from
// the chart's arguments.
func launcherPod(t *testing.T, mpsDir, control string, driverRoot Mount) *corev1.Pod {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	l, err := New(Options{
		Client: fake.NewClientset(), Namespace: namespace, NodeName: node, DriverName: "gpu.dra.dev",
		Image: chartImage, Owner: owner, PriorityClassName: "system-node-critical", ServiceAccountName: daemonSA,
		Mounts: []Mount{driverRoot},
	})
	if err != nil {
		t.Fatal(err)
	}
	capture := &capturingLauncher{Launcher: l}
	m, err := sharing.NewMPSManager(sharing.MPSOptions{
		Dir: mpsDir, ControlBinary: control, ComputeModes: noComputeModes{}, Launcher: capture, ShmSize: 1 << 20,
		Env: []string{"LD_LIBRARY_PATH=" + filepath.Join(driverRoot.Path, "usr/lib/x86_64-linux-gnu")},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Mounting the shared memory tmpfs needs root; the pod is what counts.
	_, err = m.Acquire(ctx, sharing.DeviceRef{UUID: "GPU-0c2a8e3f-1d2b-4c5e-9f00-123456789abc"}, sharing.MPSShare{ID: "claim", ConfigIndex: -1})
	if capture.pod == nil {
		t.Fatalf("the manager launched no daemon: %v", err)
	}
	return capture.pod
}

// capturingLauncher records the pod the launcher would create and fails the
// launch.
type capturingLauncher struct {
	*Launcher
	pod *corev1.Pod
}

func (c *capturingLauncher) Launch(_ context.Context, d sharing.Daemon) error {
	c.pod = c.Launcher.pod(d)
	c.pod.Name = c.pod.GenerateName + "x"
	return errors.New("captured")
}

type noComputeModes struct{}

func (noComputeModes) ComputeMode(context.Context, string) (nvml.ComputeMode, error) {
	return 0, sharing.ErrNotSupported
}

func (noComputeModes) SetComputeMode(context.Context, string, nvml.ComputeMode) error {
	return sharing.ErrNotSupported
}

func toYAML(t *testing.T, obj any) string {
	t.Helper()
	out, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
