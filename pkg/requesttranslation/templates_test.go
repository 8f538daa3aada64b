package requesttranslation

import (
	"context"
	"errors"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

func TestEnsure(t *testing.T) {
	want := Template{Name: "gpu.dra.dev-x2", Class: "gpu.dra.dev", Count: 2}
	tenant := want.Object("ns")
	tenant.Labels = nil
	other := want.Object("ns")
	other.Spec.Spec.Devices.Requests[0].Exactly.Count = 3
	defaulted := want.Object("ns")
	defaulted.Spec.Spec.Devices.Requests[0].Exactly.AllocationMode = ""
	tests := map[string]struct {
		existing    *resourceapi.ResourceClaimTemplate
		dryRun      bool
		wantCreated bool
		wantErr     bool
	}{
		"missing":                 {wantCreated: true},
		"missing, dry run":        {dryRun: true},
		"exists, same":            {existing: want.Object("ns")},
		"exists, defaults differ": {existing: defaulted},
		"exists, other count":     {existing: other, wantErr: true},
		"exists, tenant's":        {existing: tenant, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var objs []runtime.Object
			if tc.existing != nil {
				objs = append(objs, tc.existing)
			}
			client := fake.NewClientset(objs...)
			created, err := Ensure(context.Background(), client, "ns", []Template{want}, tc.dryRun)
			var e *Error
			if tc.wantErr != errors.As(err, &e) || !tc.wantErr && err != nil {
				t.Fatalf("error %v, want a refusal: %v", err, tc.wantErr)
			}
			if got := slices.Contains(created, want.Name); got != tc.wantCreated {
				t.Errorf("created %v, want created %v", created, tc.wantCreated)
			}
			got, err := client.ResourceV1().ResourceClaimTemplates("ns").Get(context.Background(), want.Name, metav1.GetOptions{})
			switch {
			case tc.existing == nil && tc.dryRun:
				if err == nil {
					t.Error("dry run created a template")
				}
			case tc.existing == nil:
				if err != nil || !want.matches(got) {
					t.Errorf("created template %+v (%v) does not match", got, err)
				}
			}
		})
	}
}
