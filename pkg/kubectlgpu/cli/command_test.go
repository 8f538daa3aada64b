package cli_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu/cli"
)

// fixture reads testdata/cluster.yaml: a simulated l4x4 node (node-b) with
// claims in namespaces default and team-b, written by pkg/kubectlgpu's
// TestCLIFixture.
func fixture(t *testing.T) []runtime.Object {
	t.Helper()
	f, err := os.Open("testdata/cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var objs []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, obj)
	}
}

// kubectlGPU runs the command line; client nil means the one the
// kubeconfig flags build.
func kubectlGPU(t *testing.T, client kubernetes.Interface, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := cli.NewCommand(cli.Options{
		Streams: genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
		Client:  client,
	})
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), errOut.String(), err
}

// apiServer serves the fixture's lists over HTTP, as JSON, and records the
// requests; forbidden resources answer 403 as RBAC does.
type apiServer struct {
	*httptest.Server
	mu        sync.Mutex
	requests  []string
	forbidden map[string]bool
}

func newAPIServer(t *testing.T, objs []runtime.Object, forbidden ...string) *apiServer {
	t.Helper()
	s := &apiServer{forbidden: map[string]bool{}}
	for _, r := range forbidden {
		s.forbidden[r] = true
	}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests = append(s.requests, r.URL.Path+"?"+r.URL.RawQuery)
		s.mu.Unlock()
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		resource, namespace := parts[len(parts)-1], ""
		if len(parts) >= 3 && parts[len(parts)-3] == "namespaces" {
			namespace = parts[len(parts)-2]
		}
		w.Header().Set("Content-Type", "application/json")
		if s.forbidden[resource] {
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(metav1.Status{
				TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
				Reason: metav1.StatusReasonForbidden, Code: http.StatusForbidden,
				Message: fmt.Sprintf("%s is forbidden: User \"dev\" cannot list resource %q", resource, resource),
				Details: &metav1.StatusDetails{Kind: resource},
			})
			return
		}
		list, err := listOf(objs, resource, namespace)
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode(list)
	}))
	t.Cleanup(s.Close)
	return s
}

func listOf(objs []runtime.Object, resource, namespace string) (runtime.Object, error) {
	inNS := func(o metav1.Object) bool { return namespace == "" || o.GetNamespace() == namespace }
	switch resource {
	case "resourceslices":
		l := &resourceapi.ResourceSliceList{TypeMeta: metav1.TypeMeta{Kind: "ResourceSliceList", APIVersion: "resource.k8s.io/v1"}}
		for _, o := range objs {
			if s, ok := o.(*resourceapi.ResourceSlice); ok {
				l.Items = append(l.Items, *s)
			}
		}
		return l, nil
	case "resourceclaims":
		l := &resourceapi.ResourceClaimList{TypeMeta: metav1.TypeMeta{Kind: "ResourceClaimList", APIVersion: "resource.k8s.io/v1"}}
		for _, o := range objs {
			if c, ok := o.(*resourceapi.ResourceClaim); ok && inNS(c) {
				l.Items = append(l.Items, *c)
			}
		}
		return l, nil
	case "deviceclasses":
		l := &resourceapi.DeviceClassList{TypeMeta: metav1.TypeMeta{Kind: "DeviceClassList", APIVersion: "resource.k8s.io/v1"}}
		for _, o := range objs {
			if c, ok := o.(*resourceapi.DeviceClass); ok {
				l.Items = append(l.Items, *c)
			}
		}
		return l, nil
	case "pods":
		l := &corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}}
		for _, o := range objs {
			if p, ok := o.(*corev1.Pod); ok && inNS(p) {
				l.Items = append(l.Items, *p)
			}
		}
		return l, nil
	}
	return nil, fmt.Errorf("no resource %q", resource)
}

func (s *apiServer) takeRequests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.requests
	s.requests = nil
	return r
}

// kubeconfig writes a kubeconfig for server with two contexts: "main"
// (current, namespace team-b) and "other" (namespace default).
func kubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	data := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: sim
  cluster: {server: %q}
users:
- name: dev
  user: {token: secret}
contexts:
- name: main
  context: {cluster: sim, user: dev, namespace: team-b}
- name: other
  context: {cluster: sim, user: dev, namespace: default}
current-context: main
`, server)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Through a real client and the kubeconfig flags, the command prints what
// the package prints, with one list per resource type.
func TestNodesOverHTTP(t *testing.T) {
	server := newAPIServer(t, fixture(t))
	out, errOut, err := kubectlGPU(t, nil, "--kubeconfig", kubeconfig(t, server.URL), "nodes")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	want, err := os.ReadFile("testdata/nodes.golden")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), out); diff != "" {
		t.Errorf("nodes (-package +command line):\n%s", diff)
	}
	wantRequests := []string{
		"/apis/resource.k8s.io/v1/resourceclaims?limit=500",
		"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3Dgpu.dra.dev&limit=500",
	}
	if diff := cmp.Diff(wantRequests, server.takeRequests()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

// The namespace comes from -A, -n, --context or the current context, as in
// kubectl.
func TestClaimsNamespace(t *testing.T) {
	server := newAPIServer(t, fixture(t))
	config := kubeconfig(t, server.URL)
	tests := map[string]struct {
		args      []string
		namespace string // of the claims and pods lists
		want      []string
		notWant   []string
	}{
		"current context": {nil, "team-b", []string{"NAME ", "train", "node-b"}, []string{"infer", "NAMESPACE"}},
		"-n":              {[]string{"-n", "default"}, "default", []string{"infer", "ts-a", "TimeSlicing, interval Long (claim)"}, []string{"train"}},
		"--context":       {[]string{"--context", "other"}, "default", []string{"infer", "ts-a"}, []string{"train"}},
		"-A":              {[]string{"-A"}, "", []string{"NAMESPACE", "team-b", "train", "default", "infer"}, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"--kubeconfig", config, "claims"}, tc.args...)
			out, errOut, err := kubectlGPU(t, nil, args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out, w) {
					t.Errorf("output has %q:\n%s", w, out)
				}
			}
			ns := ""
			if tc.namespace != "" {
				ns = "/namespaces/" + tc.namespace
			}
			wantRequests := []string{
				"/apis/resource.k8s.io/v1" + ns + "/resourceclaims?limit=500",
				"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3Dgpu.dra.dev&limit=500",
				"/apis/resource.k8s.io/v1/deviceclasses?limit=500",
				"/api/v1" + ns + "/pods?limit=500",
			}
			if diff := cmp.Diff(wantRequests, server.takeRequests()); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
		})
	}
}

func TestClaimsJSONOverHTTP(t *testing.T) {
	server := newAPIServer(t, fixture(t))
	out, _, err := kubectlGPU(t, nil, "--kubeconfig", kubeconfig(t, server.URL), "claims", "-n", "default", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var list kubectlgpu.ClaimList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	if list.Namespace != "default" || len(list.Claims) != 2 || list.Claims[1].Name != "ts-a" ||
		list.Claims[1].Devices[0].Config.Summary != "TimeSlicing, interval Long" || list.Claims[1].Pods[0].Phase != "Running" {
		t.Errorf("claims: %+v", list)
	}
}

func TestForbiddenOverHTTP(t *testing.T) {
	server := newAPIServer(t, fixture(t), "resourceclaims", "pods")
	config := kubeconfig(t, server.URL)
	_, _, err := kubectlGPU(t, nil, "--kubeconfig", config, "claims")
	want := `cannot list resourceclaims.resource.k8s.io in namespace "team-b": forbidden; kubectl gpu needs RBAC permission for the verb "list" on resource "resourceclaims" in API group "resource.k8s.io"`
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	server.forbidden["resourceclaims"] = false
	out, errOut, err := kubectlGPU(t, nil, "--kubeconfig", config, "claims")
	if err != nil || !strings.Contains(out, "train") || !strings.HasPrefix(errOut, `Warning: cannot list pods in namespace "team-b": forbidden`) {
		t.Errorf("pods forbidden: err %v, stdout %q, stderr %q", err, out, errOut)
	}
}

func TestFlagErrors(t *testing.T) {
	client := fake.NewClientset(fixture(t)...)
	tests := map[string]struct {
		args []string
		want string
	}{
		"unknown output":  {[]string{"nodes", "-o", "xml"}, `unknown output format "xml" for -o (supported: wide, json, yaml)`},
		"node needs name": {[]string{"node"}, "accepts 1 arg(s), received 0"},
		"unknown node":    {[]string{"node", "node-z"}, `node "node-z" publishes no GPUs of the gpu.dra.dev driver`},
		"another driver":  {[]string{"--driver", "gpu.example.com", "nodes"}, "the gpu.example.com driver is not installed or publishes no GPUs"},
		"unknown command": {[]string{"gpus"}, `unknown command "gpus"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, _, err := kubectlGPU(t, client, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	out, _, err := kubectlGPU(t, fake.NewClientset(), "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kubectl gpu [command]", "nodes", "node ", "claims", "--kubeconfig", "--context", "-n, --namespace", "--driver", "-o, --output"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "completion") {
		t.Errorf("help lists the completion command:\n%s", out)
	}
}
