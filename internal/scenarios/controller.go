package scenarios

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// ControllerNamespace is where the admission checks apply their claims.
const ControllerNamespace = "demo-controller"

// AdmissionCase is a ResourceClaim applied with kubectl to show the dra-controller's
// admission webhook at work.
type AdmissionCase struct {
	Name  string
	Title string
	// Valid says whether the webhook must admit it.
	Valid bool
	// Field is the field path the rejection message must name.
	Field string
	YAML  string
}

const admissionClaim = `apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: %s
  namespace: ` + ControllerNamespace + `
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: mps.gpu.dra.dev
    config:
    - requests: [gpu]
      opaque:
        driver: gpu.dra.dev
        parameters:
          apiVersion: gpu.dra.dev/v1beta1
          kind: GpuConfig
          sharing:
            strategy: MPS
%s
`

// AdmissionCases are the claims of the admission demo: two invalid GpuConfigs, which
// kubectl apply must refuse with a message naming the field, and a valid one.
var AdmissionCases = []AdmissionCase{
	{
		Name: "mps-150", Title: "MPS defaultActiveThreadPercentage: 150 (out of range)",
		Field: "sharing.mpsConfig.defaultActiveThreadPercentage",
		YAML: fmt.Sprintf(admissionClaim, "mps-150", `            mpsConfig:
              defaultActiveThreadPercentage: 150`),
	},
	{
		Name: "typo", Title: "unknown field sharing.mpsConfg (a typo)",
		Field: `unknown field "sharing.mpsConfg"`,
		YAML: fmt.Sprintf(admissionClaim, "typo", `            mpsConfg:
              defaultActiveThreadPercentage: 50`),
	},
	{
		Name: "mps-50", Title: "MPS defaultActiveThreadPercentage: 50", Valid: true,
		YAML: fmt.Sprintf(admissionClaim, "mps-50", `            mpsConfig:
              defaultActiveThreadPercentage: 50`),
	},
}

// AdmissionResult is what kubectl apply said.
type AdmissionResult struct {
	Case     AdmissionCase
	Admitted bool
	Output   string
	// APIError is the API server's message for a server-side dry run of the same
	// claim (kubectl shows the causes of an Invalid status, not who refused it).
	APIError string
}

// configPath is where the rejections must point: the claim's first config.
const configPath = "spec.devices.config[0].opaque.parameters"

// Problem says what is wrong with the result ("" if nothing).
func (a AdmissionResult) Problem() string {
	switch {
	case a.Case.Valid && !a.Admitted:
		return fmt.Sprintf("valid claim %s was refused: %s", a.Case.Name, a.Output)
	case !a.Case.Valid && a.Admitted:
		return fmt.Sprintf("invalid claim %s (%s) was admitted", a.Case.Name, a.Case.Title)
	case !a.Case.Valid && !strings.Contains(a.APIError, "admission webhook") || !a.Case.Valid && !strings.Contains(a.APIError, "denied the request"):
		return fmt.Sprintf("claim %s was refused, but not by the admission webhook: %s", a.Case.Name, a.APIError)
	case !a.Case.Valid && (!strings.Contains(a.Output, a.Case.Field) || !strings.Contains(a.Output, configPath)):
		return fmt.Sprintf("claim %s: kubectl's message does not name %s and %q: %s", a.Case.Name, configPath, a.Case.Field, a.Output)
	case !a.Case.Valid && (!strings.Contains(a.APIError, a.Case.Field) || !strings.Contains(a.APIError, configPath)):
		return fmt.Sprintf("claim %s: the API error does not name %s and %q: %s", a.Case.Name, configPath, a.Case.Field, a.APIError)
	}
	return ""
}

// Admission creates ControllerNamespace and applies every AdmissionCase with
// `kubectl apply -f -`, as a user would. CleanupController removes them.
func (r *Runner) Admission(ctx context.Context) ([]AdmissionResult, error) {
	if _, err := r.kubectl(ctx, "", "create", "namespace", ControllerNamespace); err != nil && !strings.Contains(err.Error(), "AlreadyExists") {
		return nil, err
	}
	if err := r.waitServiceAccount(ctx, ControllerNamespace); err != nil {
		return nil, err
	}
	var out []AdmissionResult
	for _, c := range AdmissionCases {
		res := AdmissionResult{Case: c}
		obj := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal([]byte(c.YAML), &obj.Object); err != nil {
			return nil, err
		}
		_, err := r.Cluster.Dynamic.Resource(resourceapi.SchemeGroupVersion.WithResource("resourceclaims")).Namespace(ControllerNamespace).
			Create(ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			res.APIError = err.Error()
		}
		text, err := r.kubectl(ctx, c.YAML, "apply", "-f", "-")
		res.Admitted, res.Output = err == nil, strings.TrimSpace(text)
		out = append(out, res)
	}
	return out, nil
}

// CleanupController deletes ControllerNamespace.
func (r *Runner) CleanupController(ctx context.Context) error {
	return r.DeleteNamespaces(ctx, ControllerNamespace)
}

// kubectl runs kubectl with stdin and returns its combined output.
func (r *Runner) kubectl(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, r.Cluster.Kubectl, append([]string{"--kubeconfig", r.Cluster.Kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// GFDLabels returns the node's labels that GPU Feature Discovery would write
// (nvidia.com/...) and the controller's gpu.dra.dev/driver label.
func (r *Runner) GFDLabels(ctx context.Context, node string) (map[string]string, error) {
	n, err := r.Cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for k, v := range n.Labels {
		if strings.HasPrefix(k, "nvidia.com/") || k == "gpu.dra.dev/driver" {
			out[k] = v
		}
	}
	return out, nil
}

// ExpectedGFDLabels derives the main GFD labels from the node's ResourceSlices,
// independently of the controller: gpu.present, gpu.product (GFD's sanitising),
// gpu.count, gpu.memory (MiB), gpu.family, mig.capable.
func (r *Runner) ExpectedGFDLabels(ctx context.Context, node string) (map[string]string, error) {
	slices, err := r.Cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.driver=" + r.Driver + ",spec.nodeName=" + node,
	})
	if err != nil {
		return nil, err
	}
	uuids := map[string]bool{}
	product, memory, cc := "", int64(0), ""
	migCapable := false
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			a := attributeStrings(r.Driver, d.Attributes)
			if deviceKind(a) != vocabulary.KindGPU {
				continue
			}
			uuids[a[vocabulary.AttrUUID]] = true
			product, cc = a[vocabulary.AttrProductName], a[vocabulary.AttrCUDAComputeCapability]
			migCapable = migCapable || a[vocabulary.AttrMIGCapable] == "true"
			if q, ok := d.Capacity[vocabulary.CapacityMemory]; ok {
				memory = q.Value.Value() >> 20
			}
		}
	}
	if len(uuids) == 0 {
		return nil, fmt.Errorf("node %s publishes no whole GPUs", node)
	}
	return map[string]string{
		"nvidia.com/gpu.present": "true",
		"nvidia.com/gpu.product": gfdProduct(product),
		"nvidia.com/gpu.count":   strconv.Itoa(len(uuids)),
		"nvidia.com/gpu.memory":  strconv.FormatInt(memory, 10),
		"nvidia.com/gpu.family":  gfdFamily(cc),
		"nvidia.com/mig.capable": strconv.FormatBool(migCapable),
	}, nil
}

var notLabelChars = regexp.MustCompile(`[^-A-Za-z0-9_. ]`)

// gfdProduct is GFD's sanitising of a product name.
func gfdProduct(p string) string {
	p = strings.Join(strings.Fields(notLabelChars.ReplaceAllString(p, "")), "-")
	if len(p) > 63 {
		p = p[:63]
	}
	return p
}

// gfdFamily maps a compute capability to GFD's family names (the common ones).
func gfdFamily(cc string) string {
	major, minor, _ := strings.Cut(cc, ".")
	minor, _, _ = strings.Cut(minor, ".")
	switch major {
	case "7":
		if minor == "5" {
			return "turing"
		}
		return "volta"
	case "8":
		if minor == "9" {
			return "ada-lovelace"
		}
		return "ampere"
	case "9":
		return "hopper"
	case "10", "12":
		return "blackwell"
	}
	return "undefined"
}

// FormatLabels returns the labels as sorted "key=value" lines.
func FormatLabels(labels map[string]string) []string {
	out := make([]string, 0, len(labels))
	for k, v := range labels {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// WaitGFDLabels waits until the node carries the labels ExpectedGFDLabels derives
// from its slices, and returns all its GFD labels and the expected ones.
func (r *Runner) WaitGFDLabels(ctx context.Context, node string) (got, want map[string]string, err error) {
	err = r.poll(ctx, "GFD labels on node "+node, func(ctx context.Context) (bool, error) {
		if want, err = r.ExpectedGFDLabels(ctx, node); err != nil {
			return false, err
		}
		if got, err = r.GFDLabels(ctx, node); err != nil {
			return false, err
		}
		return len(LabelDiff(got, want)) == 0, nil
	})
	return got, want, err
}

// LabelDiff lists the labels of want that got lacks or has with another value.
func LabelDiff(got, want map[string]string) []string {
	var out []string
	for k, v := range want {
		if g, ok := got[k]; !ok {
			out = append(out, fmt.Sprintf("%s missing (want %q)", k, v))
		} else if g != v {
			out = append(out, fmt.Sprintf("%s=%q, want %q", k, g, v))
		}
	}
	sort.Strings(out)
	return out
}
