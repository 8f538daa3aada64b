package kubectlgpu

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/internal/golden"
)

const cliqueA = "5e1f0000-0000-0000-0000-00000000000a.1"

// DomainsFixture is a disconnected domain of two trays, a ready one, and
// a new one the controller has not looked at, in two namespaces.
func DomainsFixture(t testing.TB) *dynamicfake.FakeDynamicClient {
	node := func(name string, channel int32, state gpuv1beta1.DaemonState, unreachable ...string) gpuv1beta1.ComputeDomainNode {
		return gpuv1beta1.ComputeDomainNode{Name: name, IPAddress: "10.0.0." + name[len(name)-1:], CliqueID: cliqueA, Channel: ptr.To(channel),
			Daemon: gpuv1beta1.DaemonStatus{State: state, UnreachablePeers: unreachable}}
	}
	cd := func(ns, name string, ready *metav1.Condition, nodes ...gpuv1beta1.ComputeDomainNode) runtime.Object {
		d := &gpuv1beta1.ComputeDomain{
			TypeMeta:   metav1.TypeMeta{APIVersion: gpuv1beta1.GroupVersion.String(), Kind: gpuv1beta1.ComputeDomainKind},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       gpuv1beta1.ComputeDomainSpec{Channel: gpuv1beta1.ComputeDomainChannel{ResourceClaimName: name + "-channel"}},
			Status:     gpuv1beta1.ComputeDomainStatus{Nodes: nodes},
		}
		if len(nodes) > 0 {
			d.Status.Channel = nodes[0].Channel
		}
		if name == "eval" { // template mode
			d.Spec.Channel = gpuv1beta1.ComputeDomainChannel{ResourceClaimTemplateName: name + "-channel"}
		}
		if ready != nil {
			d.Status.Conditions = []metav1.Condition{*ready}
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(d)
		if err != nil {
			t.Fatal(err)
		}
		return &unstructured.Unstructured{Object: m}
	}
	disconnected := node("tray-2", 0, gpuv1beta1.DaemonDisconnected, "tray-1")
	disconnected.Daemon.Message = "peer 10.0.0.1 lost"
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{gpuv1beta1.ComputeDomainResource: "ComputeDomainList"},
		cd("team-a", "training", &metav1.Condition{Type: "Ready", Status: "False", Reason: "DaemonDisconnected", Message: "IMEX daemon disconnected on tray-2 (cannot reach tray-1)"},
			disconnected, node("tray-1", 0, gpuv1beta1.DaemonConnected)),
		cd("team-a", "eval", &metav1.Condition{Type: "Ready", Status: "True", Reason: "Connected", Message: "the IMEX daemons of all 1 nodes are connected"},
			node("tray-1", 1, gpuv1beta1.DaemonConnected)),
		cd("team-b", "new", nil),
	)
}

func runDomains(t *testing.T, output, namespace string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := RunDomains(t.Context(), DomainsFixture(t), Options{Output: output, Out: &out, ErrOut: &errOut}, namespace); err != nil {
		t.Fatal(err)
	}
	return out.String() + errOut.String()
}

func TestDomainsGolden(t *testing.T) {
	golden.Check(t, "testdata/domains.golden", []byte(runDomains(t, "", "")))
	golden.Check(t, "testdata/domains-wide.golden", []byte(runDomains(t, OutputWide, "")))
}

func TestDomainsNamespace(t *testing.T) {
	got := runDomains(t, "", "team-b")
	if !strings.Contains(got, "new") || strings.Contains(got, "training") {
		t.Errorf("team-b's domains:\n%s", got)
	}
	if got := runDomains(t, "", "team-c"); got != "No ComputeDomains found in namespace \"team-c\".\n" {
		t.Errorf("no domains: %q", got)
	}
}

func TestDomainsJSON(t *testing.T) {
	var list DomainList
	if err := json.Unmarshal([]byte(runDomains(t, OutputJSON, "team-a")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Domains) != 2 {
		t.Fatalf("%d domains, want 2", len(list.Domains))
	}
	training := list.Domains[1]
	if training.Name != "training" || training.Ready != "False" || training.Reason != "DaemonDisconnected" ||
		len(training.Cliques) != 1 || training.Cliques[0] != cliqueA || len(training.Nodes) != 2 ||
		training.Nodes[1].Daemon != "Disconnected" || strings.Join(training.Nodes[1].UnreachablePeers, ",") != "tray-1" {
		t.Errorf("training: %+v", training)
	}
	if eval := list.Domains[0]; eval.Template != "eval-channel" || eval.Claim != "" || eval.Channel == nil || *eval.Channel != 1 {
		t.Errorf("eval (template mode, channel 1): %+v", eval)
	}
}
