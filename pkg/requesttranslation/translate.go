// Package requesttranslation turns the device plugin's extended resource
// requests (resources.limits: {nvidia.com/gpu: N}) into ResourceClaims, for
// schedulers that cannot read DRA extended resources themselves (Volcano:
// docs/migration.md "Volcano"). kube-scheduler maps such a request onto the
// DeviceClass whose spec.extendedResourceName names it; this package does
// the same mapping at admission: each container's request for N of a served
// name becomes a pod-level resourceClaims entry from a ResourceClaimTemplate
// asking that DeviceClass for exactly N devices, referenced by the
// container.
//
// The functions are pure: they read a decoded pod spec and return JSON
// patch operations that touch only the fields they change (a container's
// resources.limits/requests entries and resources.claims, the pod spec's
// resourceClaims, one annotation), so a field the decoding types do not
// know survives the mutation.
package requesttranslation

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Op is one JSON patch (RFC 6902) operation.
type Op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Template is a ResourceClaimTemplate a translated object needs: exactly
// Count devices of DeviceClass Class, named Name (TemplateName).
type Template struct {
	Name  string
	Class string
	Count int64
}

// ClassLookup returns the name of the DeviceClass that serves an extended
// resource name, "" when none does.
type ClassLookup func(corev1.ResourceName) string

// Options configure a translation.
type Options struct {
	// Classes maps extended resource names to DeviceClasses.
	Classes ClassLookup
	// ServesClass reports whether a DeviceClass serves an extended
	// resource name; pods whose claims an earlier translation wrote need
	// their templates (Result.Templates). nil: none are looked for.
	ServesClass func(class string) bool
	// GangGuard adds a cpu request of GangGuardCPU to a pod spec that has
	// ResourceClaims but neither cpu nor memory anywhere, so that Volcano
	// does not take its pods for best-effort ones, which its backfill
	// action binds one by one without the gang check.
	GangGuard bool
}

// GangGuardCPU is the cpu request the gang guard adds.
const GangGuardCPU = "1m"

// Error is a refusal of the object, naming the field at fault.
type Error struct {
	Field   string
	Message string
}

func (e *Error) Error() string { return e.Field + ": " + e.Message }

// specResult is what translating one pod spec yields.
type specResult struct {
	ops       []Op
	templates []Template
	changes   []string
}

// container is one container of a pod spec with its JSON pointer and field
// path.
type container struct {
	c     *corev1.Container
	ptr   string
	field string
	claim string // claim name prefix of its kind: "c" or "i"
	index int
}

func containers(spec *corev1.PodSpec, ptr, field string) []container {
	var out []container
	for i := range spec.InitContainers {
		out = append(out, container{&spec.InitContainers[i], fmt.Sprintf("%s/initContainers/%d", ptr, i), fmt.Sprintf("%s.initContainers[%d]", field, i), "i", i})
	}
	for i := range spec.Containers {
		out = append(out, container{&spec.Containers[i], fmt.Sprintf("%s/containers/%d", ptr, i), fmt.Sprintf("%s.containers[%d]", field, i), "c", i})
	}
	return out
}

// translateSpec translates spec, found at JSON pointer ptr and field path
// field of the object. spec is not modified.
func translateSpec(spec *corev1.PodSpec, ptr, field string, opts Options) (specResult, error) {
	var res specResult
	taken := map[string]bool{}
	for _, rc := range spec.ResourceClaims {
		taken[rc.Name] = true
	}
	var podClaims []corev1.PodResourceClaim
	for _, ct := range containers(spec, ptr, field) {
		r := &ct.c.Resources
		names := servedNames(r, opts.Classes)
		claimsPresent := r.Claims != nil
		for _, name := range names {
			class := opts.Classes(name)
			n, err := count(r, name, ct.field)
			if err != nil {
				return specResult{}, err
			}
			key := escape(string(name))
			if _, ok := r.Limits[name]; ok {
				res.ops = append(res.ops, Op{Op: "remove", Path: ct.ptr + "/resources/limits/" + key})
			}
			if _, ok := r.Requests[name]; ok {
				res.ops = append(res.ops, Op{Op: "remove", Path: ct.ptr + "/resources/requests/" + key})
			}
			if n == 0 {
				res.changes = append(res.changes, fmt.Sprintf("%s: removed %s=0", ct.field, name))
				continue
			}
			claimName := ClaimName(name, ct.claim, ct.index)
			if taken[claimName] {
				return specResult{}, &Error{Field: field + ".resourceClaims",
					Message: fmt.Sprintf("claim name %q, which the translation of %s.resources[%s] needs, is already taken; rename that claim", claimName, ct.field, name)}
			}
			taken[claimName] = true
			tmpl, err := TemplateName(class, n)
			if err != nil {
				return specResult{}, &Error{Field: fmt.Sprintf("%s.resources.limits[%s]", ct.field, name), Message: err.Error()}
			}
			res.templates = append(res.templates, Template{Name: tmpl, Class: class, Count: n})
			podClaims = append(podClaims, corev1.PodResourceClaim{Name: claimName, ResourceClaimTemplateName: &tmpl})
			ref := corev1.ResourceClaim{Name: claimName}
			if claimsPresent {
				res.ops = append(res.ops, Op{Op: "add", Path: ct.ptr + "/resources/claims/-", Value: ref})
			} else {
				res.ops = append(res.ops, Op{Op: "add", Path: ct.ptr + "/resources/claims", Value: []corev1.ResourceClaim{ref}})
				claimsPresent = true
			}
			res.changes = append(res.changes, fmt.Sprintf("%s: %s=%d -> claim %s (ResourceClaimTemplate %s, DeviceClass %s)", ct.field, name, n, claimName, tmpl, class))
		}
	}
	if len(podClaims) > 0 {
		if spec.ResourceClaims == nil {
			res.ops = append(res.ops, Op{Op: "add", Path: ptr + "/resourceClaims", Value: podClaims})
		} else {
			for _, pc := range podClaims {
				res.ops = append(res.ops, Op{Op: "add", Path: ptr + "/resourceClaims/-", Value: pc})
			}
		}
	}
	if opts.GangGuard && len(spec.ResourceClaims)+len(podClaims) > 0 && !hasCPUOrMemory(spec) && len(spec.Containers) > 0 {
		op, where := guard(spec, ptr, field)
		res.ops = append(res.ops, op)
		res.changes = append(res.changes, fmt.Sprintf("%s: added requests cpu=%s (Volcano gang guard)", where, GangGuardCPU))
	}
	return res, nil
}

// servedNames are the resource names in r's limits and requests that a
// DeviceClass serves, sorted.
func servedNames(r *corev1.ResourceRequirements, classes ClassLookup) []corev1.ResourceName {
	var names []corev1.ResourceName
	for _, list := range []corev1.ResourceList{r.Limits, r.Requests} {
		for name := range list {
			if !slices.Contains(names, name) && classes(name) != "" {
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	return names
}

// count is the number of devices a container asks of name: a
// non-negative integer, the same in limits and requests where both are set.
func count(r *corev1.ResourceRequirements, name corev1.ResourceName, field string) (int64, error) {
	lim, hasLim := r.Limits[name]
	req, hasReq := r.Requests[name]
	q, where := lim, "limits"
	if !hasLim {
		q, where = req, "requests"
	}
	path := fmt.Sprintf("%s.resources.%s[%s]", field, where, name)
	if hasLim && hasReq && lim.Cmp(req) != 0 {
		return 0, &Error{Field: fmt.Sprintf("%s.resources.requests[%s]", field, name),
			Message: fmt.Sprintf("%s must equal limits (%s) for a device resource; it is %s", name, lim.String(), req.String())}
	}
	if q.Sign() < 0 {
		return 0, &Error{Field: path, Message: fmt.Sprintf("must not be negative, is %s", q.String())}
	}
	if q.MilliValue()%1000 != 0 {
		return 0, &Error{Field: path, Message: fmt.Sprintf("must be a whole number of devices, is %s", q.String())}
	}
	return q.Value(), nil
}

// hasCPUOrMemory reports whether the pod spec asks for cpu or memory
// anywhere Volcano counts them: any container's requests or limits (limits
// default requests), or pod-level resources.
func hasCPUOrMemory(spec *corev1.PodSpec) bool {
	lists := []corev1.ResourceList{}
	if spec.Resources != nil {
		lists = append(lists, spec.Resources.Requests, spec.Resources.Limits)
	}
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			lists = append(lists, cs[i].Resources.Requests, cs[i].Resources.Limits)
		}
	}
	for _, l := range lists {
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := l[name]; ok && q.Sign() > 0 {
				return true
			}
		}
	}
	return false
}

// guard is the operation that adds the gang guard's cpu request to the
// first container, and that container's field path. It adds into what is
// there: the requests map, else the resources object (present when it has
// limits or claims), else it creates resources.
func guard(spec *corev1.PodSpec, ptr, field string) (Op, string) {
	c := &spec.Containers[0]
	p := ptr + "/containers/0/resources"
	where := field + ".containers[0]"
	cpu := resource.MustParse(GangGuardCPU)
	switch {
	case c.Resources.Requests != nil:
		return Op{Op: "add", Path: p + "/requests/cpu", Value: cpu}, where
	case c.Resources.Limits != nil || c.Resources.Claims != nil:
		return Op{Op: "add", Path: p + "/requests", Value: corev1.ResourceList{corev1.ResourceCPU: cpu}}, where
	default:
		return Op{Op: "add", Path: p, Value: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: cpu}}}, where
	}
}

// ClaimName is the pod-level claim name of the translation of name in
// container index of a kind ("c": containers, "i": init containers): name
// as a DNS label, e.g. nvidia-com-gpu-c0.
func ClaimName(name corev1.ResourceName, kind string, index int) string {
	suffix := fmt.Sprintf("-%s%d", kind, index)
	s := strings.Trim(nonLabel.ReplaceAllString(strings.ToLower(string(name)), "-"), "-")
	if max := validation.DNS1123LabelMaxLength - len(suffix); len(s) > max {
		s = strings.TrimRight(s[:max], "-")
	}
	return s + suffix
}

var nonLabel = regexp.MustCompile(`[^a-z0-9]+`)

// TemplateName is the name of the ResourceClaimTemplate asking DeviceClass
// class for exactly n devices, e.g. gpu.dra.dev-x2.
func TemplateName(class string, n int64) (string, error) {
	name := fmt.Sprintf("%s-x%d", class, n)
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", fmt.Errorf("DeviceClass %s: ResourceClaimTemplate name %q is invalid: %s", class, name, strings.Join(errs, "; "))
	}
	return name, nil
}

// escape escapes a JSON pointer reference token (RFC 6901).
func escape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
