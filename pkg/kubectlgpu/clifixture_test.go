package kubectlgpu_test

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/golden"
)

// The command-line tests (package cli) cannot link the simulated NVML, so
// this test writes their fixture: a simulated l4x4 node's slices, claims
// the allocator placed on it and their pods, as a YAML stream, and the
// nodes table the package prints for it.
func TestCLIFixture(t *testing.T) {
	f := newFixture(t, "node-b=l4x4")
	f.run("node-b", "default", at.Claim("infer", at.Exactly("gpu", driverName, 1)))
	f.run("node-b", "default", withConfig(at.Claim("ts-a", onGPU(1, "timeslice")), longTimeSlice))
	f.run("node-b", "team-b", at.Claim("train", at.Exactly("gpu", driverName, 1)))

	objs := append([]runtime.Object{}, f.objects...)
	for _, s := range f.slices {
		objs = append(objs, s)
	}
	for _, c := range f.classes {
		objs = append(objs, c)
	}
	key := func(o runtime.Object) string {
		m := o.(metav1.Object)
		return fmt.Sprintf("%T/%s/%s", o, m.GetNamespace(), m.GetName())
	}
	slices.SortFunc(objs, func(a, b runtime.Object) int { return cmp.Compare(key(a), key(b)) })
	var buf bytes.Buffer
	for _, o := range objs {
		setTypeMeta(t, o)
		data, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&buf, "---\n%s", data)
	}
	golden.Check(t, "cli/testdata/cluster.yaml", buf.Bytes())
	golden.Check(t, "cli/testdata/nodes.golden", []byte(mustRun(t, f.client(), nodes(), "")))
}

func setTypeMeta(t *testing.T, o runtime.Object) {
	t.Helper()
	gvks, _, err := scheme.Scheme.ObjectKinds(o)
	if err != nil {
		t.Fatal(err)
	}
	o.GetObjectKind().SetGroupVersionKind(gvks[0])
}
