package kubectlgpu

import (
	"context"
	"errors"
	"fmt"

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
	err := fetch(ctx, client, scope, src, func([]resourceapi.ResourceClaim) {}, func(page []resourceapi.ResourceSlice) {
		src.Slices = append(src.Slices, page...)
	}, func() { src.Slices = nil })
	if err != nil {
		return nil, err
	}
	return src, nil
}

// Load is Fetch and Build in one, reading the slices a page at a time: of
// the largest list only one page is in memory at once, besides the
// inventory.
func Load(ctx context.Context, client kubernetes.Interface, scope Scope) (*Inventory, []string, error) {
	src := &Source{}
	var b *builder
	slices := 0
	err := fetch(ctx, client, scope, src, func(claims []resourceapi.ResourceClaim) {
		b = newBuilder(scope.Driver, claims)
	}, func(page []resourceapi.ResourceSlice) {
		slices += len(page)
		b.addSlices(page)
	}, func() {
		b, slices = newBuilder(scope.Driver, src.Claims), 0
	})
	if err != nil {
		return nil, nil, err
	}
	inv := b.finish(src)
	inv.slices = slices
	return inv, src.Warnings, nil
}

// fetch lists claims into src (and hands them to claims), then slices page
// by page to slices (restart means start over), then classes and pods.
func fetch(ctx context.Context, client kubernetes.Interface, scope Scope, src *Source,
	claims func([]resourceapi.ResourceClaim), slices func([]resourceapi.ResourceSlice), restart func()) error {
	err := listPages(ctx, refClaims(scope.Namespace), metav1.ListOptions{},
		client.ResourceV1().ResourceClaims(scope.Namespace).List,
		func(l *resourceapi.ResourceClaimList) ([]resourceapi.ResourceClaim, string) {
			return l.Items, l.Continue
		},
		func(page []resourceapi.ResourceClaim) { src.Claims = append(src.Claims, page...) },
		func() { src.Claims = nil })
	if err != nil {
		return err
	}
	claims(src.Claims)

	sliceFields := fields.Set{resourceapi.ResourceSliceSelectorDriver: scope.Driver}
	if scope.Node != "" {
		sliceFields[resourceapi.ResourceSliceSelectorNodeName] = scope.Node
	}
	err = listPages(ctx, refSlices, metav1.ListOptions{FieldSelector: sliceFields.String()},
		client.ResourceV1().ResourceSlices().List,
		func(l *resourceapi.ResourceSliceList) ([]resourceapi.ResourceSlice, string) {
			return l.Items, l.Continue
		},
		func(page []resourceapi.ResourceSlice) {
			// The API server filters by the field selector already;
			// filtering again keeps the result right for servers and
			// fakes that ignore it.
			slices(deleteFunc(page, func(s *resourceapi.ResourceSlice) bool {
				return s.Spec.Driver != scope.Driver || (scope.Node != "" && sliceNode(s) != scope.Node)
			}))
		}, restart)
	if err != nil {
		return err
	}

	if scope.Classes {
		err := listPages(ctx, refClasses, metav1.ListOptions{},
			client.ResourceV1().DeviceClasses().List,
			func(l *resourceapi.DeviceClassList) ([]resourceapi.DeviceClass, string) { return l.Items, l.Continue },
			func(page []resourceapi.DeviceClass) { src.Classes = append(src.Classes, page...) },
			func() { src.Classes = nil })
		if err := src.soften(err, "pending claims are shown only when they request a class named after the driver"); err != nil {
			return err
		}
	}
	if scope.Pods {
		opts := metav1.ListOptions{}
		if scope.Node != "" {
			opts.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", scope.Node).String()
		}
		err := listPages(ctx, refPods(scope.Namespace), opts,
			client.CoreV1().Pods(scope.Namespace).List,
			func(l *corev1.PodList) ([]corev1.Pod, string) { return l.Items, l.Continue },
			func(page []corev1.Pod) {
				src.Pods = append(src.Pods, deleteFunc(page, func(p *corev1.Pod) bool {
					return scope.Node != "" && p.Spec.NodeName != scope.Node
				})...)
			},
			func() { src.Pods = nil })
		if err := src.soften(err, "pods are named from the claims' reservedFor, without their phase"); err != nil {
			return err
		}
	}
	return nil
}

// deleteFunc is slices.DeleteFunc without copying each (large) element
// into the callback.
func deleteFunc[T any](s []T, del func(*T) bool) []T {
	out := s[:0]
	for i := range s {
		if !del(&s[i]) {
			out = append(out, s[i])
		}
	}
	return out
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

// listPages runs one list, page by page, handing each page to each. If
// the continue token expires between pages, it calls restart and falls
// back to a single unpaginated list.
func listPages[L any, T any](ctx context.Context, ref resourceRef, opts metav1.ListOptions,
	list func(context.Context, metav1.ListOptions) (*L, error),
	split func(*L) ([]T, string), each func([]T), restart func()) error {
	opts.Limit = pageSize
	for {
		l, err := list(ctx, opts)
		if err != nil {
			if apierrors.IsResourceExpired(err) && opts.Continue != "" {
				restart()
				opts.Continue, opts.Limit = "", 0
				continue
			}
			return &ListError{Resource: ref.resource, Group: ref.group, Namespace: ref.namespace, namespaced: ref.namespaced, Err: err}
		}
		page, cont := split(l)
		each(page)
		if cont == "" {
			return nil
		}
		opts.Continue = cont
	}
}
