package requesttranslation

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ErrDecode wraps the errors of objects that cannot be decoded.
var ErrDecode = errors.New("cannot decode")

// Result is the translation of one object.
type Result struct {
	// Patch is empty when nothing changes.
	Patch []Op
	// Templates are the ResourceClaimTemplates the translated object
	// refers to, sorted by name and without duplicates: those of this
	// translation and, for pods, those of an earlier one (a Volcano Job's
	// translated template, or a re-created pod), which must exist for the
	// pod to run.
	Templates []Template
	// Changes say what changed, one entry per change; the annotation's
	// value.
	Changes []string
}

// Pod translates a Pod (JSON) when its spec.schedulerName is one of
// schedulers. annotation is the key under which the changes are recorded.
func Pod(raw []byte, schedulers []string, annotation string, opts Options) (Result, error) {
	var pod corev1.Pod
	if err := json.Unmarshal(raw, &pod); err != nil {
		return Result{}, fmt.Errorf("%w Pod: %w", ErrDecode, err)
	}
	if !slices.Contains(schedulers, pod.Spec.SchedulerName) {
		return Result{}, nil
	}
	sr, err := translateSpec(&pod.Spec, "/spec", "spec", opts)
	if err != nil {
		return Result{}, err
	}
	res := Result{Patch: sr.ops, Templates: append(sr.templates, earlier(&pod.Spec, opts)...), Changes: sr.changes}
	return res.finish(pod.Annotations, annotation), nil
}

// job is the part of a batch.volcano.sh/v1alpha1 Job the translation reads.
type job struct {
	Metadata struct {
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"metadata"`
	Spec struct {
		SchedulerName string `json:"schedulerName,omitempty"`
		Tasks         []struct {
			Template corev1.PodTemplateSpec `json:"template"`
		} `json:"tasks,omitempty"`
	} `json:"spec"`
}

// Job translates the pod templates of a Volcano Job (JSON,
// batch.volcano.sh/v1alpha1) whose pods go to one of schedulers: a
// template's own schedulerName, or the Job's where the template has none
// (Volcano's job controller fills it in so). The changes are recorded on
// the Job.
func Job(raw []byte, schedulers []string, annotation string, opts Options) (Result, error) {
	var j job
	if err := json.Unmarshal(raw, &j); err != nil {
		return Result{}, fmt.Errorf("%w Job: %w", ErrDecode, err)
	}
	var res Result
	for i := range j.Spec.Tasks {
		spec := &j.Spec.Tasks[i].Template.Spec
		scheduler := spec.SchedulerName
		if scheduler == "" {
			scheduler = j.Spec.SchedulerName
		}
		if !slices.Contains(schedulers, scheduler) {
			continue
		}
		sr, err := translateSpec(spec, fmt.Sprintf("/spec/tasks/%d/template/spec", i), fmt.Sprintf("spec.tasks[%d].template.spec", i), opts)
		if err != nil {
			return Result{}, err
		}
		res.Patch = append(res.Patch, sr.ops...)
		res.Templates = append(res.Templates, sr.templates...)
		res.Changes = append(res.Changes, sr.changes...)
	}
	return res.finish(j.Metadata.Annotations, annotation), nil
}

// finish records the changes in the annotation and sorts the templates.
func (r Result) finish(annotations map[string]string, key string) Result {
	slices.SortFunc(r.Templates, func(a, b Template) int { return strings.Compare(a.Name, b.Name) })
	r.Templates = slices.Compact(r.Templates)
	if len(r.Changes) == 0 {
		return r
	}
	value := strings.Join(r.Changes, "; ")
	if annotations == nil {
		r.Patch = append(r.Patch, Op{Op: "add", Path: "/metadata/annotations", Value: map[string]string{key: value}})
	} else {
		r.Patch = append(r.Patch, Op{Op: "add", Path: "/metadata/annotations/" + escape(key), Value: value})
	}
	return r
}

// ownClaim matches the claim names ClaimName makes.
var ownClaim = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?-[ci][0-9]+$`)

// earlier returns the templates of claims that an earlier translation
// wrote into spec: a claim named as ClaimName names them, whose template
// is named as TemplateName names them, for a DeviceClass that serves an
// extended resource.
func earlier(spec *corev1.PodSpec, opts Options) []Template {
	var out []Template
	for _, rc := range spec.ResourceClaims {
		if rc.ResourceClaimTemplateName == nil || !ownClaim.MatchString(rc.Name) || opts.ServesClass == nil {
			continue
		}
		name := *rc.ResourceClaimTemplateName
		i := strings.LastIndex(name, "-x")
		if i <= 0 {
			continue
		}
		n, err := strconv.ParseInt(name[i+2:], 10, 64)
		if err != nil || n <= 0 {
			continue
		}
		class := name[:i]
		if want, err := TemplateName(class, n); err != nil || want != name || !opts.ServesClass(class) {
			continue
		}
		out = append(out, Template{Name: name, Class: class, Count: n})
	}
	return out
}
