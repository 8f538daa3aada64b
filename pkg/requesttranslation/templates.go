package requesttranslation

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// ManagedByLabel and ManagedByValue mark the ResourceClaimTemplates the
// translation creates; a template of the same name without them (a
// tenant's) is never used in their place.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "gpu-dra-controller"
)

// requestName is the name of the one device request in a template.
const requestName = "devices"

// Object returns the ResourceClaimTemplate t in namespace.
func (t Template) Object(namespace string) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{
			Name: t.Name, Namespace: namespace,
			Labels: map[string]string{ManagedByLabel: ManagedByValue},
		},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: requestName, Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: t.Class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: t.Count,
			}}},
		}}},
	}
}

// matches reports whether got is t's template: ours, asking exactly Count
// devices of Class and nothing else. Fields the API server defaults are
// compared by meaning, not by presence.
func (t Template) matches(got *resourceapi.ResourceClaimTemplate) bool {
	if got.Labels[ManagedByLabel] != ManagedByValue {
		return false
	}
	d := got.Spec.Spec.Devices
	if len(d.Requests) != 1 || len(d.Constraints) > 0 || len(d.Config) > 0 {
		return false
	}
	e := d.Requests[0].Exactly
	if e == nil || len(d.Requests[0].FirstAvailable) > 0 || e.DeviceClassName != t.Class || len(e.Selectors) > 0 ||
		len(e.Tolerations) > 0 || e.AdminAccess != nil && *e.AdminAccess || e.Capacity != nil {
		return false
	}
	mode := e.AllocationMode
	return (mode == "" || mode == resourceapi.DeviceAllocationModeExactCount) && e.Count == t.Count
}

// Ensure makes sure the templates exist in namespace: it creates those
// that are missing (not under dryRun: the webhook has no side effects on
// dry-run requests) and refuses, with an error naming it, a template of
// that name that is not the translation's (a tenant's, or changed). It
// returns the names of the templates it created.
func Ensure(ctx context.Context, client kubernetes.Interface, namespace string, templates []Template, dryRun bool) ([]string, error) {
	api := client.ResourceV1().ResourceClaimTemplates(namespace)
	var created []string
	for _, t := range templates {
		got, err := api.Get(ctx, t.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if dryRun {
				continue
			}
			got, err = api.Create(ctx, t.Object(namespace), metav1.CreateOptions{})
			if err == nil {
				created = append(created, t.Name)
				klog.FromContext(ctx).V(2).Info("Created ResourceClaimTemplate for request translation", "template", klog.KObj(got))
				continue
			}
			if apierrors.IsAlreadyExists(err) { // another admission created it meanwhile
				got, err = api.Get(ctx, t.Name, metav1.GetOptions{})
			}
		}
		if err != nil {
			return created, fmt.Errorf("ResourceClaimTemplate %s/%s: %w", namespace, t.Name, err)
		}
		if !t.matches(got) {
			return created, &Error{Field: "ResourceClaimTemplate " + namespace + "/" + t.Name,
				Message: fmt.Sprintf("exists but is not the one the translation of %d devices of DeviceClass %s uses (label %s=%s, one request of exactly %d devices of that class, nothing else); "+
					"delete or rename it, the translation then creates its own", t.Count, t.Class, ManagedByLabel, ManagedByValue, t.Count)}
		}
	}
	return created, nil
}
