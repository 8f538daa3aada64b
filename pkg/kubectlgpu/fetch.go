package kubectlgpu

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
)

// pageSize is the chunk size of a list, as kubectl uses: a list of every
// slice of 1,000 DGX nodes (about 320 MB) then arrives in pieces the API
// server can serve without buffering it whole.
const pageSize = 500

// Source is what an Inventory is built from, as listed from the API server.
type Source struct {
	Slices  []resourceapi.ResourceSlice
	Claims  []resourceapi.ResourceClaim
	Classes []resourceapi.DeviceClass
	Pods    []corev1.Pod
	// Warnings are reads that failed without stopping the command: pods or
	// DeviceClasses that RBAC does not let the user list.
	Warnings []string
}

// Scope says what Fetch lists.
type Scope struct {
	// Driver is the DRA driver name whose slices are listed.
	Driver string
	// Node, when set, limits slices and pods to one node (by field selector).
	Node string
	// Namespace, when set, limits claims and pods to one namespace; empty
	// means all namespaces.
	Namespace string
	// Classes and Pods say whether DeviceClasses and Pods are listed.
	Classes, Pods bool
}

// Fetch lists what scope asks for with one list per resource type, never
// one call per node or claim. ResourceSlices and ResourceClaims must be
// readable; Pods and DeviceClasses only enrich the output, so a forbidden
// list of them becomes a warning.
func Fetch(ctx context.Context, client kubernetes.Interface, scope Scope) (*Source, error) {
	src := &Source{}
	sliceFields := fields.Set{resourceapi.ResourceSliceSelectorDriver: scope.Driver}
	if scope.Node != "" {
		sliceFields[resourceapi.ResourceSliceSelectorNodeName] = scope.Node
	}
	var err error
	src.Slices, err = listAll(ctx, refSlices,
		metav1.ListOptions{FieldSelector: sliceFields.String()},
		client.ResourceV1().ResourceSlices().List,
		func(l *resourceapi.ResourceSliceList) ([]resourceapi.ResourceSlice, string) {
			return l.Items, l.Continue
		})
	if err != nil {
		return nil, err
	}
	// The API server filters by the field selector already; filtering again
	// keeps the result right for servers and fakes that ignore it.
	src.Slices = slices.DeleteFunc(src.Slices, func(s resourceapi.ResourceSlice) bool {
		return s.Spec.Driver != scope.Driver || (scope.Node != "" && sliceNode(&s) != scope.Node)
	})
	src.Claims, err = listAll(ctx, refClaims(scope.Namespace),
		metav1.ListOptions{},
		client.ResourceV1().ResourceClaims(scope.Namespace).List,
		func(l *resourceapi.ResourceClaimList) ([]resourceapi.ResourceClaim, string) {
			return l.Items, l.Continue
		})
	if err != nil {
		return nil, err
	}
	if scope.Classes {
		src.Classes, err = listAll(ctx, refClasses,
			metav1.ListOptions{},
			client.ResourceV1().DeviceClasses().List,
			func(l *resourceapi.DeviceClassList) ([]resourceapi.DeviceClass, string) { return l.Items, l.Continue })
		if err := src.soften(err, "pending claims are shown only when they request a class named after the driver"); err != nil {
			return nil, err
		}
	}
	if scope.Pods {
		opts := metav1.ListOptions{}
		if scope.Node != "" {
			opts.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", scope.Node).String()
		}
		src.Pods, err = listAll(ctx, refPods(scope.Namespace), opts,
			client.CoreV1().Pods(scope.Namespace).List,
			func(l *corev1.PodList) ([]corev1.Pod, string) { return l.Items, l.Continue })
		if err := src.soften(err, "pods are named from the claims' reservedFor, without their phase"); err != nil {
			return nil, err
		}
		if scope.Node != "" {
			src.Pods = slices.DeleteFunc(src.Pods, func(p corev1.Pod) bool { return p.Spec.NodeName != scope.Node })
		}
	}
	return src, nil
}

// soften turns a forbidden list into a warning.
func (s *Source) soften(err error, consequence string) error {
	var le *ListError
	if err != nil && errors.As(err, &le) && apierrors.IsForbidden(le.Err) {
		s.Warnings = append(s.Warnings, fmt.Sprintf("%s; %s", le.Error(), consequence))
		return nil
	}
	return err
}

// resourceRef names a resource type (and namespace) for messages.
type resourceRef struct {
	resource, group string
	namespaced      bool
	namespace       string
}

var (
	refSlices  = resourceRef{resource: "resourceslices", group: "resource.k8s.io"}
	refClasses = resourceRef{resource: "deviceclasses", group: "resource.k8s.io"}
)

func refClaims(ns string) resourceRef {
	return resourceRef{resource: "resourceclaims", group: "resource.k8s.io", namespaced: true, namespace: ns}
}

func refPods(ns string) resourceRef {
	return resourceRef{resource: "pods", namespaced: true, namespace: ns}
}

// ListError is a failed list of one resource type. Its message names the
// resource, the verb and, when RBAC forbids the list, the rule to grant.
type ListError struct {
	// Resource and Group name the resource type ("" is the core group).
	Resource, Group string
	// Namespace is the namespace listed; empty for all namespaces or a
	// cluster-scoped resource.
	Namespace  string
	namespaced bool
	Err        error
}

func (e *ListError) Error() string {
	what := e.Resource
	if e.Group != "" {
		what += "." + e.Group
	}
	switch {
	case !e.namespaced:
	case e.Namespace == "":
		what += " in all namespaces"
	default:
		what += fmt.Sprintf(" in namespace %q", e.Namespace)
	}
	group := `"" (core)`
	if e.Group != "" {
		group = fmt.Sprintf("%q", e.Group)
	}
	switch {
	case apierrors.IsForbidden(e.Err):
		return fmt.Sprintf("cannot list %s: forbidden; kubectl gpu needs RBAC permission for the verb \"list\" on resource %q in API group %s",
			what, e.Resource, group)
	case apierrors.IsUnauthorized(e.Err):
		return fmt.Sprintf("cannot list %s: the API server rejected the credentials (check --kubeconfig, --context, --user or --token): %v", what, e.Err)
	case apierrors.IsNotFound(e.Err) && e.Group != "":
		return fmt.Sprintf("cannot list %s: the API server does not serve %s/v1 (DRA needs Kubernetes 1.34 or later): %v", what, e.Group, e.Err)
	}
	return fmt.Sprintf("list %s: %v", what, e.Err)
}

func (e *ListError) Unwrap() error { return e.Err }

// listAll runs one list, page by page. If the continue token expires
// between pages, it falls back to a single unpaginated list.
func listAll[L any, T any](ctx context.Context, ref resourceRef, opts metav1.ListOptions,
	list func(context.Context, metav1.ListOptions) (*L, error),
	split func(*L) ([]T, string)) ([]T, error) {
	opts.Limit = pageSize
	var items []T
	for {
		l, err := list(ctx, opts)
		if err != nil {
			if apierrors.IsResourceExpired(err) && opts.Continue != "" {
				opts.Continue, opts.Limit, items = "", 0, nil
				continue
			}
			return nil, &ListError{Resource: ref.resource, Group: ref.group, Namespace: ref.namespace, namespaced: ref.namespaced, Err: err}
		}
		page, cont := split(l)
		items = append(items, page...)
		if cont == "" {
			return items, nil
		}
		opts.Continue = cont
	}
}
