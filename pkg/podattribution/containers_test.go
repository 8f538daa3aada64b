package podattribution

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// ctr is a container using the given pod claims.
func ctr(name string, claims ...corev1.ResourceClaim) corev1.Container {
	return corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Claims: claims}}
}

func TestClaimContainers(t *testing.T) {
	direct := corev1.PodResourceClaim{Name: "gpu", ResourceClaimName: ptr.To("shared-gpu")}
	templated := corev1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu-template")}
	generated := []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To("trainer-gpu-x7k2")}}
	tests := map[string]struct {
		claims   []corev1.PodResourceClaim
		statuses []corev1.PodResourceClaimStatus
		init     []corev1.Container
		main     []corev1.Container
		want     map[string][]ContainerUse
	}{
		"claim by name": {
			claims: []corev1.PodResourceClaim{direct},
			main:   []corev1.Container{ctr("trainer", corev1.ResourceClaim{Name: "gpu"}), ctr("logger")},
			want:   map[string][]ContainerUse{"shared-gpu": {{Container: "trainer"}}},
		},
		"claim from a template, named in the pod status": {
			claims:   []corev1.PodResourceClaim{templated},
			statuses: generated,
			main:     []corev1.Container{ctr("trainer", corev1.ResourceClaim{Name: "gpu"})},
			want:     map[string][]ContainerUse{"trainer-gpu-x7k2": {{Container: "trainer"}}},
		},
		"template claim not generated (yet)": {
			claims: []corev1.PodResourceClaim{templated},
			main:   []corev1.Container{ctr("trainer", corev1.ResourceClaim{Name: "gpu"})},
			want:   map[string][]ContainerUse{},
		},
		"several containers, one series each": {
			claims: []corev1.PodResourceClaim{direct},
			main:   []corev1.Container{ctr("a", corev1.ResourceClaim{Name: "gpu"}), ctr("b", corev1.ResourceClaim{Name: "gpu"})},
			want:   map[string][]ContainerUse{"shared-gpu": {{Container: "a"}, {Container: "b"}}},
		},
		"request-specific references": {
			claims: []corev1.PodResourceClaim{direct},
			main: []corev1.Container{
				ctr("a", corev1.ResourceClaim{Name: "gpu", Request: "big"}, corev1.ResourceClaim{Name: "gpu", Request: "small"}),
				ctr("b", corev1.ResourceClaim{Name: "gpu", Request: "small"}, corev1.ResourceClaim{Name: "gpu"}),
			},
			want: map[string][]ContainerUse{"shared-gpu": {{Container: "a", Requests: []string{"big", "small"}}, {Container: "b"}}},
		},
		"init and sidecar containers": {
			claims: []corev1.PodResourceClaim{direct},
			init: []corev1.Container{
				ctr("warmup", corev1.ResourceClaim{Name: "gpu"}),
				func() corev1.Container {
					c := ctr("exporter", corev1.ResourceClaim{Name: "gpu"})
					c.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
					return c
				}(),
			},
			main: []corev1.Container{ctr("trainer", corev1.ResourceClaim{Name: "gpu"})},
			want: map[string][]ContainerUse{"shared-gpu": {{Container: "warmup"}, {Container: "exporter"}, {Container: "trainer"}}},
		},
		"two claims": {
			claims:   []corev1.PodResourceClaim{direct, {Name: "mig", ResourceClaimTemplateName: ptr.To("mig")}},
			statuses: []corev1.PodResourceClaimStatus{{Name: "mig", ResourceClaimName: ptr.To("p-mig-1")}},
			main:     []corev1.Container{ctr("a", corev1.ResourceClaim{Name: "gpu"}), ctr("b", corev1.ResourceClaim{Name: "mig"})},
			want:     map[string][]ContainerUse{"shared-gpu": {{Container: "a"}}, "p-mig-1": {{Container: "b"}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pod := &corev1.Pod{
				Spec:   corev1.PodSpec{ResourceClaims: tc.claims, InitContainers: tc.init, Containers: tc.main},
				Status: corev1.PodStatus{ResourceClaimStatuses: tc.statuses},
			}
			if got := ClaimContainers(pod); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ClaimContainers = %+v, want %+v", got, tc.want)
			}
		})
	}
}
