package requesttranslation

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// DeviceClassQuotaPrefix is the prefix of the device count keys that
// Volcano's capacity plugin (capacity.DynamicResourceAllocationEnable)
// reads from a Queue's resource lists: deviceclass/<DeviceClass>.
const DeviceClassQuotaPrefix = "deviceclass/"

// queue is the part of a scheduling.volcano.sh/v1beta1 Queue the
// translation reads.
type queue struct {
	Metadata struct {
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"metadata"`
	Spec struct {
		Capability corev1.ResourceList `json:"capability,omitempty"`
		Deserved   corev1.ResourceList `json:"deserved,omitempty"`
		Guarantee  struct {
			Resource corev1.ResourceList `json:"resource,omitempty"`
		} `json:"guarantee,omitempty"`
	} `json:"spec"`
}

// quotaList is one resource list of a Queue with its JSON pointer and field
// path.
type quotaList struct {
	list  corev1.ResourceList
	old   corev1.ResourceList
	ptr   string
	field string
}

func (q *queue) lists(old *queue) []quotaList {
	if old == nil {
		old = &queue{}
	}
	return []quotaList{
		{q.Spec.Capability, old.Spec.Capability, "/spec/capability", "spec.capability"},
		{q.Spec.Deserved, old.Spec.Deserved, "/spec/deserved", "spec.deserved"},
		{q.Spec.Guarantee.Resource, old.Spec.Guarantee.Resource, "/spec/guarantee/resource", "spec.guarantee.resource"},
	}
}

// Queue translates the quota of a Volcano Queue (JSON,
// scheduling.volcano.sh/v1beta1): in spec.capability, spec.deserved and
// spec.guarantee.resource, each extended resource name that a DeviceClass
// serves (nvidia.com/gpu: 4) gets the device count key of that class beside
// it (deviceclass/gpu.dra.dev: 4), which is what Volcano's capacity plugin
// counts translated pods' claims against. The user's key stays.
//
// The keys the translation derived are recorded in the annotation (e.g.
// "spec.capability[deviceclass/gpu.dra.dev]"), so that an update replaces
// or removes them as their source changes. A device count key the user
// wrote is never changed: one that differs from its source is refused.
// oldRaw is the Queue before an update, nil on create; on update, a
// recorded key counts as derived only while its value is the old one (a
// user who changes it takes it over).
func Queue(raw, oldRaw []byte, annotation string, classes ClassLookup) (Result, error) {
	var q queue
	if err := json.Unmarshal(raw, &q); err != nil {
		return Result{}, fmt.Errorf("%w Queue: %w", ErrDecode, err)
	}
	var old *queue
	recorded := q.Metadata.Annotations[annotation]
	if oldRaw != nil {
		old = &queue{}
		if err := json.Unmarshal(oldRaw, old); err != nil {
			return Result{}, fmt.Errorf("%w old Queue: %w", ErrDecode, err)
		}
		recorded = old.Metadata.Annotations[annotation]
	}
	owned := parseDerived(recorded)
	var res Result
	var derived []string
	for _, l := range q.lists(old) {
		d, err := translateQuota(l, owned, classes, &res)
		if err != nil {
			return Result{}, err
		}
		derived = append(derived, d...)
	}
	value := strings.Join(derived, ", ")
	current, has := q.Metadata.Annotations[annotation]
	switch {
	case value == "" && has:
		res.Patch = append(res.Patch, Op{Op: "remove", Path: "/metadata/annotations/" + escape(annotation)})
	case value == "" || (has && current == value):
	case q.Metadata.Annotations == nil:
		res.Patch = append(res.Patch, Op{Op: "add", Path: "/metadata/annotations", Value: map[string]string{annotation: value}})
	default:
		res.Patch = append(res.Patch, Op{Op: "add", Path: "/metadata/annotations/" + escape(annotation), Value: value})
	}
	return res, nil
}

// derivedEntry matches one entry of the annotation's value.
var derivedEntry = regexp.MustCompile(`^(spec\.capability|spec\.deserved|spec\.guarantee\.resource)\[(deviceclass/[^\]]+)\]$`)

// parseDerived reads the annotation's value: the derived keys as
// "<field>[<key>]". Entries it does not know are ignored: they own nothing.
func parseDerived(value string) map[string]bool {
	out := map[string]bool{}
	for _, e := range strings.Split(value, ",") {
		if e = strings.TrimSpace(e); derivedEntry.MatchString(e) {
			out[e] = true
		}
	}
	return out
}

// translateQuota adds to res what list l needs and returns its derived
// keys as annotation entries, sorted.
func translateQuota(l quotaList, owned map[string]bool, classes ClassLookup, res *Result) ([]string, error) {
	entry := func(key corev1.ResourceName) string { return fmt.Sprintf("%s[%s]", l.field, key) }
	// ours: a key the annotation records that (on update) the user did not change.
	ours := func(key corev1.ResourceName) bool {
		if !owned[entry(key)] {
			return false
		}
		if l.old == nil {
			return true
		}
		o, ok := l.old[key]
		return ok && o.Cmp(l.list[key]) == 0
	}
	type source struct {
		name corev1.ResourceName
		q    resource.Quantity
	}
	want := map[corev1.ResourceName]source{}
	names := make([]corev1.ResourceName, 0, len(l.list))
	for name := range l.list {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		class := classes(name)
		if class == "" {
			continue
		}
		q := l.list[name]
		if q.Sign() < 0 || q.MilliValue()%1000 != 0 {
			return nil, &Error{Field: entry(name), Message: fmt.Sprintf("must be a whole, non-negative number of devices, is %s", q.String())}
		}
		if q.Sign() == 0 && l.field == "spec.capability" {
			return nil, &Error{Field: entry(name), Message: fmt.Sprintf("0 cannot be translated: Volcano's capacity plugin reads %s%s: 0 as no limit; remove %s from the queue's capability or give it at least 1", DeviceClassQuotaPrefix, class, name)}
		}
		key := corev1.ResourceName(DeviceClassQuotaPrefix + class)
		if prev, ok := want[key]; ok && prev.q.Cmp(q) != 0 {
			return nil, &Error{Field: entry(name), Message: fmt.Sprintf("is %s, but %s, served by the same DeviceClass %s, is %s; make them equal or remove one", q.String(), prev.name, class, prev.q.String())}
		}
		want[key] = source{name, q}
	}
	var derived []string
	keys := make([]corev1.ResourceName, 0, len(want))
	for key := range want {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	for _, key := range keys {
		src := want[key]
		value := resource.NewQuantity(src.q.Value(), resource.DecimalSI)
		cur, has := l.list[key]
		path := l.ptr + "/" + escape(string(key))
		switch {
		case has && !ours(key):
			if cur.Cmp(src.q) != 0 {
				return nil, &Error{Field: entry(key), Message: fmt.Sprintf("is %s, but %s is %s and DeviceClass %s serves %s; make them equal or remove one", cur.String(), entry(src.name), src.q.String(), key[len(DeviceClassQuotaPrefix):], src.name)}
			}
			continue // the user's own key, equal: not derived
		case has && cur.Cmp(src.q) != 0:
			res.Patch = append(res.Patch, Op{Op: "replace", Path: path, Value: value})
			res.Changes = append(res.Changes, fmt.Sprintf("%s: %s -> %s (from %s)", entry(key), cur.String(), value, src.name))
		case !has:
			res.Patch = append(res.Patch, Op{Op: "add", Path: path, Value: value})
			res.Changes = append(res.Changes, fmt.Sprintf("%s: added %s (from %s)", entry(key), value, src.name))
		}
		derived = append(derived, entry(key))
	}
	// Derived keys whose source is gone.
	for _, name := range names {
		if _, ok := want[name]; !ok && strings.HasPrefix(string(name), DeviceClassQuotaPrefix) && ours(name) {
			res.Patch = append(res.Patch, Op{Op: "remove", Path: l.ptr + "/" + escape(string(name))})
			res.Changes = append(res.Changes, fmt.Sprintf("%s: removed (its source is gone)", entry(name)))
		}
	}
	return derived, nil
}
