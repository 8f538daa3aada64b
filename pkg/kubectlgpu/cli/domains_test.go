package cli_test

import (
	"bytes"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu/cli"
)

func TestDomainsCommand(t *testing.T) {
	domain := func(ns, name string) runtime.Object {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(gpuv1beta1.GroupVersion.String())
		u.SetKind(gpuv1beta1.ComputeDomainKind)
		u.SetNamespace(ns)
		u.SetName(name)
		_ = unstructured.SetNestedField(u.Object, name+"-channel", "spec", "channel", "resourceClaimName")
		_ = unstructured.SetNestedSlice(u.Object, []any{map[string]any{
			"type": "Ready", "status": "False", "reason": "NoNodes", "message": "m", "lastTransitionTime": metav1.Now().UTC().Format("2006-01-02T15:04:05Z"),
		}}, "status", "conditions")
		return u
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{gpuv1beta1.ComputeDomainResource: "ComputeDomainList"},
		domain("team-a", "training"), domain("team-b", "eval"))
	for name, tc := range map[string]struct {
		args      []string
		want, not []string
	}{
		"all namespaces": {args: []string{"domains", "-A"}, want: []string{"training", "eval", "NoNodes"}},
		"one namespace":  {args: []string{"domains", "-n", "team-b"}, want: []string{"eval"}, not: []string{"training"}},
		"yaml":           {args: []string{"domains", "-n", "team-a", "-o", "yaml"}, want: []string{"name: training", "claim: training-channel"}},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			cmd := cli.NewCommand(cli.Options{
				Streams: genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
				Dynamic: dyn,
			})
			cmd.SetArgs(tc.args)
			if err := cmd.Execute(); err != nil {
				t.Fatalf("%v: %v\n%s", tc.args, err, errOut.String())
			}
			for _, s := range tc.want {
				if !strings.Contains(out.String(), s) {
					t.Errorf("output lacks %q:\n%s", s, out.String())
				}
			}
			for _, s := range tc.not {
				if strings.Contains(out.String(), s) {
					t.Errorf("output has %q:\n%s", s, out.String())
				}
			}
		})
	}
}
