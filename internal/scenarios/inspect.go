package scenarios

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// PodReport is what a pod of a scenario got and what its containers see.
type PodReport struct {
	Namespace, Name string
	Node            string
	Phase           corev1.PodPhase
	// ExpectPending is set for pods that must stay Pending; Events then explains why.
	ExpectPending bool
	Events        []string
	Claims        []ClaimReport
	// Containers maps container names to their view (only for running pods).
	Containers map[string]*ContainerView
	// ContainerOrder lists the containers in pod spec order.
	ContainerOrder []string
}

// ClaimReport is one ResourceClaim of a pod and its allocation.
type ClaimReport struct {
	// PodClaimName is the name in pod.spec.resourceClaims ("" for the claim
	// made for extended resources).
	PodClaimName string
	Name         string
	// Extended is set for the claim the scheduler made for extended resources.
	Extended bool
	Devices  []DeviceReport
}

// DeviceReport is one allocated device with the attributes of its slice.
type DeviceReport struct {
	Request, Driver, Pool, Device string
	ShareID                       string
	Consumed                      map[string]string
	// Attributes are the device's attributes as strings; our driver's without
	// their domain (productName, uuid, minor, parentMinor, profile, type, ...),
	// others qualified (resource.kubernetes.io/numaNode).
	Attributes map[string]string
	// MPSDaemons names the pods running the MPS control daemon of an MPS
	// share's GPU, with their phase.
	MPSDaemons []string
}

// ContainerView is what a container sees, read from inside it.
type ContainerView struct {
	// Env holds the NVIDIA_* and CUDA_* variables.
	Env map[string]string
	// DevNodes lists /dev/nvidia* and /dev/nvidia-caps/* device files.
	DevNodes []string
	// NvidiaSMI is the output of nvidia-smi -L.
	NvidiaSMI string
	// MPSPipe lists the files of $CUDA_MPS_PIPE_DIRECTORY, if set.
	MPSPipe []string
	Err     error
}

// deviceKind is the kind of a device, from its attributes as strings.
func deviceKind(attrs map[string]string) vocabulary.Kind {
	return vocabulary.Kind(attrs[vocabulary.AttrType])
}

// GPU returns the minor number of the GPU a device belongs to ("" if unknown).
func (d DeviceReport) GPU() string {
	if m := d.Attributes[vocabulary.AttrParentMinor]; m != "" {
		return m
	}
	return d.Attributes[vocabulary.AttrMinor]
}

// UUID returns the GPU or MIG UUID a container of the claim should see ("" for a
// dynamic MIG device, whose UUID exists only once created).
func (d DeviceReport) UUID() string {
	if deviceKind(d.Attributes) == vocabulary.KindMIG && d.Attributes[vocabulary.AttrStatic] != "true" {
		return ""
	}
	return d.Attributes[vocabulary.AttrUUID]
}

// viewScript prints what a container sees, in sections.
const viewScript = `echo '##ENV'; env; echo '##DEV'; for f in /dev/nvidia* /dev/nvidia-caps/*; do if [ -e "$f" ] && [ ! -d "$f" ]; then echo "$f"; fi; done; echo '##SMI'; nvidia-smi -L 2>&1; echo '##MPS'; if [ -n "$CUDA_MPS_PIPE_DIRECTORY" ]; then ls -1 "$CUDA_MPS_PIPE_DIRECTORY" 2>&1; fi; true`

// Inspect reports on every pod of the scenario's namespaces, in name order.
func (r *Runner) Inspect(ctx context.Context, s *Scenario) ([]*PodReport, error) {
	devices, err := r.deviceIndex(ctx)
	if err != nil {
		return nil, err
	}
	var out []*PodReport
	for _, ns := range s.Namespaces() {
		pods, err := r.Cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
		for i := range pods.Items {
			rep, err := r.inspectPod(ctx, &pods.Items[i], devices)
			if err != nil {
				return nil, err
			}
			out = append(out, rep)
		}
	}
	return out, nil
}

// InspectPod reports on one pod.
func (r *Runner) InspectPod(ctx context.Context, ns, name string) (*PodReport, error) {
	devices, err := r.deviceIndex(ctx)
	if err != nil {
		return nil, err
	}
	pod, err := r.Cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return r.inspectPod(ctx, pod, devices)
}

func (r *Runner) inspectPod(ctx context.Context, pod *corev1.Pod, devices map[string]map[string]string) (*PodReport, error) {
	rep := &PodReport{
		Namespace: pod.Namespace, Name: pod.Name, Node: pod.Spec.NodeName, Phase: pod.Status.Phase,
		ExpectPending: !expectRunning(pod.Annotations),
		Containers:    map[string]*ContainerView{},
	}
	if pod.Status.Phase != corev1.PodRunning {
		evs, err := r.PodEvents(ctx, pod.Namespace, pod.Name)
		if err != nil {
			return nil, err
		}
		rep.Events = lastDistinct(evs, 2)
	}
	var refs []ClaimReport
	// A claim named in the pod spec has no status entry; a template's
	// generated claim has one.
	for _, c := range pod.Spec.ResourceClaims {
		if c.ResourceClaimName != nil {
			refs = append(refs, ClaimReport{PodClaimName: c.Name, Name: *c.ResourceClaimName})
		}
	}
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil {
			refs = append(refs, ClaimReport{PodClaimName: st.Name, Name: *st.ResourceClaimName})
		}
	}
	if ext := pod.Status.ExtendedResourceClaimStatus; ext != nil {
		refs = append(refs, ClaimReport{Name: ext.ResourceClaimName, Extended: true})
	}
	for _, ref := range refs {
		claim, err := r.Cluster.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("claim %s of pod %s/%s: %w", ref.Name, pod.Namespace, pod.Name, err)
		}
		ref.Devices = allocatedDevices(claim, devices)
		rep.Claims = append(rep.Claims, ref)
	}
	if pod.Status.Phase == corev1.PodRunning {
		for _, c := range pod.Spec.Containers {
			rep.ContainerOrder = append(rep.ContainerOrder, c.Name)
			rep.Containers[c.Name] = r.containerView(ctx, pod, c.Name)
		}
	}
	for i := range rep.Claims {
		if err := r.findMPSDaemons(ctx, rep.Claims[i].Devices, rep.mpsMIGDevice()); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// mpsMIGDevice is the MIG UUID a container of the pod reaches through an MPS
// pipe directory ("" if none): a dynamic MIG device has no UUID attribute,
// only the container knows which instance it got.
func (rep *PodReport) mpsMIGDevice() string {
	for _, v := range rep.Containers {
		if v.Env["CUDA_MPS_PIPE_DIRECTORY"] == "" {
			continue
		}
		for _, id := range strings.Split(v.Env["NVIDIA_VISIBLE_DEVICES"], ",") {
			if strings.HasPrefix(id, "MIG-") {
				return id
			}
		}
	}
	return ""
}

// findMPSDaemons fills in the MPS control daemon pods of MPS shares and of
// a MIG device under MPS (migUUID): the plugin runs one per GPU or MIG
// device under MPS, annotated with the device's UUID.
func (r *Runner) findMPSDaemons(ctx context.Context, devices []DeviceReport, migUUID string) error {
	for i := range devices {
		d := &devices[i]
		uuid := d.Attributes[vocabulary.AttrUUID]
		switch deviceKind(d.Attributes) {
		case vocabulary.KindMPS:
		case vocabulary.KindMIG:
			if migUUID == "" {
				continue
			}
			uuid = migUUID
		default:
			continue
		}
		pods, err := r.Cluster.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=mps-control-daemon"})
		if err != nil {
			return fmt.Errorf("list MPS control daemon pods: %w", err)
		}
		for _, p := range pods.Items {
			if p.Annotations[d.Driver+"/device"] == uuid {
				d.MPSDaemons = append(d.MPSDaemons, fmt.Sprintf("pod %s/%s (%s)", p.Namespace, p.Name, p.Status.Phase))
			}
		}
	}
	return nil
}

func allocatedDevices(claim *resourceapi.ResourceClaim, devices map[string]map[string]string) []DeviceReport {
	if claim.Status.Allocation == nil {
		return nil
	}
	var out []DeviceReport
	for _, res := range claim.Status.Allocation.Devices.Results {
		d := DeviceReport{Request: res.Request, Driver: res.Driver, Pool: res.Pool, Device: res.Device,
			Attributes: devices[res.Driver+"/"+res.Pool+"/"+res.Device], Consumed: map[string]string{}}
		if res.ShareID != nil {
			d.ShareID = string(*res.ShareID)
		}
		for name, q := range res.ConsumedCapacity {
			d.Consumed[string(name)] = q.String()
		}
		out = append(out, d)
	}
	return out
}

func (r *Runner) containerView(ctx context.Context, pod *corev1.Pod, container string) *ContainerView {
	v := &ContainerView{Env: map[string]string{}}
	out, err := r.Cluster.Exec(ctx, pod.Namespace, pod.Name, container, "sh", "-c", viewScript)
	if err != nil {
		v.Err = err
		return v
	}
	section := ""
	var smi []string
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if strings.HasPrefix(line, "##") {
			section = line
			continue
		}
		switch section {
		case "##ENV":
			k, val, ok := strings.Cut(line, "=")
			if ok && (strings.HasPrefix(k, "NVIDIA_") || strings.HasPrefix(k, "CUDA_")) {
				v.Env[k] = val
			}
		case "##DEV":
			v.DevNodes = append(v.DevNodes, line)
		case "##SMI":
			if line != "" {
				smi = append(smi, line)
			}
		case "##MPS":
			v.MPSPipe = append(v.MPSPipe, line)
		}
	}
	v.NvidiaSMI = strings.Join(smi, "\n")
	return v
}

// deviceIndex maps driver/pool/device to the device's attributes, from all slices.
func (r *Runner) deviceIndex(ctx context.Context) (map[string]map[string]string, error) {
	slices, err := r.Cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]string{}
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			out[s.Spec.Driver+"/"+s.Spec.Pool.Name+"/"+d.Name] = attributeStrings(s.Spec.Driver, d.Attributes)
		}
	}
	return out, nil
}

func attributeStrings(driver string, attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) map[string]string {
	out := map[string]string{}
	for name, a := range attrs {
		key := strings.TrimPrefix(string(name), driver+"/")
		switch {
		case a.StringValue != nil:
			out[key] = *a.StringValue
		case a.IntValue != nil:
			out[key] = fmt.Sprint(*a.IntValue)
		case a.BoolValue != nil:
			out[key] = fmt.Sprint(*a.BoolValue)
		case a.VersionValue != nil:
			out[key] = *a.VersionValue
		}
	}
	return out
}

func lastDistinct(msgs []string, n int) []string {
	var out []string
	seen := map[string]bool{}
	for i := len(msgs) - 1; i >= 0 && len(out) < n; i-- {
		if !seen[msgs[i]] {
			seen[msgs[i]] = true
			out = append([]string{msgs[i]}, out...)
		}
	}
	return out
}
