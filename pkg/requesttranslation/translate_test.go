package requesttranslation

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const annotation = "gpu.dra.dev/translated"

var testOpts = Options{
	Classes: func(n corev1.ResourceName) string {
		return map[corev1.ResourceName]string{"nvidia.com/gpu": "gpu.dra.dev", "nvidia.com/mig-1g.10gb": "mig-1g.10gb.gpu.dra.dev"}[n]
	},
	ServesClass: func(c string) bool { return c == "gpu.dra.dev" || c == "mig-1g.10gb.gpu.dra.dev" },
	GangGuard:   true,
}

// apply applies a translation's patch as the API server does and returns
// the result as a generic value.
func apply(t *testing.T, in []byte, ops []Op) any {
	t.Helper()
	p, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(p)
	if err != nil {
		t.Fatal(err)
	}
	out, err := patch.Apply(in)
	if err != nil {
		t.Fatalf("apply %s: %v", p, err)
	}
	var v any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func fromYAML(t *testing.T, s string) []byte {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func generic(t *testing.T, j []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(j, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestPod(t *testing.T) {
	tests := map[string]struct {
		in, want  string // YAML; want "" = unchanged
		templates []Template
		err       string // field of the *Error
	}{
		"one container, limits only; unknown fields kept": {
			in: `
metadata: {name: p, futureField: x}
spec:
  schedulerName: volcano
  futureSpecField: {a: 1}
  containers:
  - name: c
    futureContainerField: y
    resources: {limits: {nvidia.com/gpu: 2}}`,
			want: `
metadata: {name: p, futureField: x, annotations: {gpu.dra.dev/translated: "spec.containers[0]: nvidia.com/gpu=2 -> claim nvidia-com-gpu-c0 (ResourceClaimTemplate gpu.dra.dev-x2, DeviceClass gpu.dra.dev); spec.containers[0]: added requests cpu=1m (Volcano gang guard)"}}
spec:
  schedulerName: volcano
  futureSpecField: {a: 1}
  resourceClaims: [{name: nvidia-com-gpu-c0, resourceClaimTemplateName: gpu.dra.dev-x2}]
  containers:
  - name: c
    futureContainerField: y
    resources: {limits: {}, claims: [{name: nvidia-com-gpu-c0}], requests: {cpu: 1m}}`,
			templates: []Template{{Name: "gpu.dra.dev-x2", Class: "gpu.dra.dev", Count: 2}},
		},
		"several containers, init container, existing claims, cpu present": {
			in: `
metadata: {name: p, annotations: {a: b}}
spec:
  schedulerName: volcano
  resourceClaims: [{name: mine, resourceClaimName: shared}]
  initContainers:
  - name: i
    resources: {limits: {nvidia.com/gpu: 1}, requests: {nvidia.com/gpu: 1, memory: 1Gi}}
  containers:
  - name: a
    resources: {limits: {cpu: 2}, claims: [{name: mine}]}
  - name: b
    resources: {limits: {nvidia.com/gpu: "4", nvidia.com/mig-1g.10gb: 1, example.com/other: 3}}`,
			want: `
metadata: {name: p, annotations: {a: b, gpu.dra.dev/translated: "spec.initContainers[0]: nvidia.com/gpu=1 -> claim nvidia-com-gpu-i0 (ResourceClaimTemplate gpu.dra.dev-x1, DeviceClass gpu.dra.dev); spec.containers[1]: nvidia.com/gpu=4 -> claim nvidia-com-gpu-c1 (ResourceClaimTemplate gpu.dra.dev-x4, DeviceClass gpu.dra.dev); spec.containers[1]: nvidia.com/mig-1g.10gb=1 -> claim nvidia-com-mig-1g-10gb-c1 (ResourceClaimTemplate mig-1g.10gb.gpu.dra.dev-x1, DeviceClass mig-1g.10gb.gpu.dra.dev)"}}
spec:
  schedulerName: volcano
  resourceClaims:
  - {name: mine, resourceClaimName: shared}
  - {name: nvidia-com-gpu-i0, resourceClaimTemplateName: gpu.dra.dev-x1}
  - {name: nvidia-com-gpu-c1, resourceClaimTemplateName: gpu.dra.dev-x4}
  - {name: nvidia-com-mig-1g-10gb-c1, resourceClaimTemplateName: mig-1g.10gb.gpu.dra.dev-x1}
  initContainers:
  - name: i
    resources: {limits: {}, requests: {memory: 1Gi}, claims: [{name: nvidia-com-gpu-i0}]}
  containers:
  - name: a
    resources: {limits: {cpu: 2}, claims: [{name: mine}]}
  - name: b
    resources: {limits: {example.com/other: 3}, claims: [{name: nvidia-com-gpu-c1}, {name: nvidia-com-mig-1g-10gb-c1}]}`,
			templates: []Template{
				{Name: "gpu.dra.dev-x1", Class: "gpu.dra.dev", Count: 1},
				{Name: "gpu.dra.dev-x4", Class: "gpu.dra.dev", Count: 4},
				{Name: "mig-1g.10gb.gpu.dra.dev-x1", Class: "mig-1g.10gb.gpu.dra.dev", Count: 1},
			},
		},
		"zero is only removed; no claims, so no guard": {
			in:   `{metadata: {name: p}, spec: {schedulerName: volcano, containers: [{name: c, resources: {limits: {nvidia.com/gpu: 0}}}]}}`,
			want: `{metadata: {name: p, annotations: {gpu.dra.dev/translated: "spec.containers[0]: removed nvidia.com/gpu=0"}}, spec: {schedulerName: volcano, containers: [{name: c, resources: {limits: {}}}]}}`,
		},
		"user's claims only: guard into a container without resources": {
			in: `{metadata: {name: p}, spec: {schedulerName: volcano, resourceClaims: [{name: g, resourceClaimTemplateName: mine}], containers: [{name: c}]}}`,
			want: `{metadata: {name: p, annotations: {gpu.dra.dev/translated: "spec.containers[0]: added requests cpu=1m (Volcano gang guard)"}},
  spec: {schedulerName: volcano, resourceClaims: [{name: g, resourceClaimTemplateName: mine}], containers: [{name: c, resources: {requests: {cpu: 1m}}}]}}`,
		},
		"other scheduler: untouched": {
			in: `{metadata: {name: p}, spec: {schedulerName: default-scheduler, containers: [{name: c, resources: {limits: {nvidia.com/gpu: 1}}}]}}`,
		},
		"unserved name: untouched": {
			in: `{metadata: {name: p}, spec: {schedulerName: volcano, containers: [{name: c, resources: {limits: {example.com/gpu: 1, cpu: 1}}}]}}`,
		},
		"already translated: no-op, template still reported": {
			in: `{metadata: {name: p}, spec: {schedulerName: volcano, resourceClaims: [{name: nvidia-com-gpu-c0, resourceClaimTemplateName: gpu.dra.dev-x2}],
  containers: [{name: c, resources: {requests: {cpu: 1m}, claims: [{name: nvidia-com-gpu-c0}]}}]}}`,
			templates: []Template{{Name: "gpu.dra.dev-x2", Class: "gpu.dra.dev", Count: 2}},
		},
		"requests differ from limits": {
			in:  `{metadata: {name: p}, spec: {schedulerName: volcano, containers: [{name: a}, {name: c, resources: {limits: {nvidia.com/gpu: 2}, requests: {nvidia.com/gpu: 1}}}]}}`,
			err: "spec.containers[1].resources.requests[nvidia.com/gpu]",
		},
		"fraction": {
			in:  `{metadata: {name: p}, spec: {schedulerName: volcano, containers: [{name: c, resources: {limits: {nvidia.com/gpu: 500m}}}]}}`,
			err: "spec.containers[0].resources.limits[nvidia.com/gpu]",
		},
		"negative request": {
			in:  `{metadata: {name: p}, spec: {schedulerName: volcano, containers: [{name: c, resources: {requests: {nvidia.com/gpu: -1}}}]}}`,
			err: "spec.containers[0].resources.requests[nvidia.com/gpu]",
		},
		"claim name collision": {
			in:  `{metadata: {name: p}, spec: {schedulerName: volcano, resourceClaims: [{name: nvidia-com-gpu-c0, resourceClaimName: x}], containers: [{name: c, resources: {limits: {nvidia.com/gpu: 1}}}]}}`,
			err: "spec.resourceClaims",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := fromYAML(t, tc.in)
			res, err := Pod(in, []string{"volcano"}, annotation, testOpts)
			if tc.err != "" {
				var e *Error
				if !errors.As(err, &e) || e.Field != tc.err {
					t.Fatalf("error %v, want one for field %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := generic(t, in)
			if tc.want != "" {
				want = generic(t, fromYAML(t, tc.want))
			} else if len(res.Patch) > 0 {
				t.Errorf("patch %+v, want none", res.Patch)
			}
			if diff := cmp.Diff(want, apply(t, in, res.Patch)); diff != "" {
				t.Errorf("patched pod (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.templates, res.Templates); diff != "" {
				t.Errorf("templates (-want +got):\n%s", diff)
			}
			// Translating the translated pod changes nothing.
			out, _ := json.Marshal(apply(t, in, res.Patch))
			again, err := Pod(out, []string{"volcano"}, annotation, testOpts)
			if err != nil || len(again.Patch) > 0 {
				t.Errorf("second translation: patch %+v, error %v; want none", again.Patch, err)
			}
		})
	}
}

func TestJob(t *testing.T) {
	in := fromYAML(t, `
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: tensorflow-job}
spec:
  schedulerName: volcano
  minAvailable: 4
  futureJobField: z
  tasks:
  - replicas: 4
    name: worker
    template:
      spec:
        containers:
        - resources:
            limits:
              nvidia.com/gpu: 2
  - replicas: 1
    name: elsewhere
    template:
      spec:
        schedulerName: default-scheduler
        containers:
        - resources: {limits: {nvidia.com/gpu: 1}}
  - replicas: 1
    name: ps
    template:
      metadata: {labels: {role: ps}}
      spec:
        containers:
        - resources: {limits: {nvidia.com/gpu: 1, cpu: 1}}`)
	want := fromYAML(t, `
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: tensorflow-job
  annotations: {gpu.dra.dev/translated: "spec.tasks[0].template.spec.containers[0]: nvidia.com/gpu=2 -> claim nvidia-com-gpu-c0 (ResourceClaimTemplate gpu.dra.dev-x2, DeviceClass gpu.dra.dev); spec.tasks[0].template.spec.containers[0]: added requests cpu=1m (Volcano gang guard); spec.tasks[2].template.spec.containers[0]: nvidia.com/gpu=1 -> claim nvidia-com-gpu-c0 (ResourceClaimTemplate gpu.dra.dev-x1, DeviceClass gpu.dra.dev)"}
spec:
  schedulerName: volcano
  minAvailable: 4
  futureJobField: z
  tasks:
  - replicas: 4
    name: worker
    template:
      spec:
        resourceClaims: [{name: nvidia-com-gpu-c0, resourceClaimTemplateName: gpu.dra.dev-x2}]
        containers:
        - resources: {limits: {}, requests: {cpu: 1m}, claims: [{name: nvidia-com-gpu-c0}]}
  - replicas: 1
    name: elsewhere
    template:
      spec:
        schedulerName: default-scheduler
        containers:
        - resources: {limits: {nvidia.com/gpu: 1}}
  - replicas: 1
    name: ps
    template:
      metadata: {labels: {role: ps}}
      spec:
        resourceClaims: [{name: nvidia-com-gpu-c0, resourceClaimTemplateName: gpu.dra.dev-x1}]
        containers:
        - resources: {limits: {cpu: 1}, claims: [{name: nvidia-com-gpu-c0}]}`)
	res, err := Job(in, []string{"volcano"}, annotation, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(generic(t, want), apply(t, in, res.Patch)); diff != "" {
		t.Errorf("patched Job (-want +got):\n%s", diff)
	}
	wantTemplates := []Template{{Name: "gpu.dra.dev-x1", Class: "gpu.dra.dev", Count: 1}, {Name: "gpu.dra.dev-x2", Class: "gpu.dra.dev", Count: 2}}
	if diff := cmp.Diff(wantTemplates, res.Templates); diff != "" {
		t.Errorf("templates (-want +got):\n%s", diff)
	}
	again, err := Job(want, []string{"volcano"}, annotation, testOpts)
	if err != nil || len(again.Patch) > 0 {
		t.Errorf("second translation: patch %+v, error %v; want none", again.Patch, err)
	}

	bad := strings.Replace(string(in), `"cpu":1,"nvidia.com/gpu":1`, `"cpu":1,"nvidia.com/gpu":"1.5"`, 1)
	var e *Error
	if _, err := Job([]byte(bad), []string{"volcano"}, annotation, testOpts); !errors.As(err, &e) || e.Field != "spec.tasks[2].template.spec.containers[0].resources.limits[nvidia.com/gpu]" {
		t.Errorf("fractional request in task 2: error %v", err)
	}
	if res, err := Job(in, nil, annotation, testOpts); err != nil || len(res.Patch) > 0 {
		t.Errorf("no schedulers listed: patch %+v, error %v; want none", res.Patch, err)
	}
}

func TestNames(t *testing.T) {
	long := corev1.ResourceName("example.com/" + strings.Repeat("a", 80))
	if n := ClaimName(long, "c", 12); len(n) > 63 || !strings.HasSuffix(n, "-c12") {
		t.Errorf("ClaimName(%s) = %s", long, n)
	}
	if _, err := TemplateName(strings.Repeat("a", 251), 2); err == nil {
		t.Error("TemplateName accepted a name over 253 characters")
	}
}
