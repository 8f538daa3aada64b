package webhook

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// A ResourceQuota with hard: {nvidia.com/gpu: 8}, as GPU guides written for
// the device plugin teach, passes the API server's validation (any qualified
// name with a '/' does) but is never enforced: the quota evaluators count
// extended resources only as requests.<name> (they cannot be overcommitted,
// so there is no limits.<name> either; limits.nvidia.com/gpu is accepted
// and ignored too). The webhook answers such a quota with a warning naming
// the fix and never refuses it.
//
// The names warned about are those the NVIDIA device plugin advertises
// (vocabulary.IsDevicePluginResource: nvidia.com/gpu, nvidia.com/gpu.<suffix>,
// nvidia.com/mig-<profile>, which covers every name the chart's DeviceClasses
// declare by default), and any other extended resource name the chart's
// DeviceClasses are set to serve (extendedResourceName, extendedResources),
// which the chart passes as --quota-resource-names. Other names belong to
// other drivers, and a generic rule would have to know every valid quota
// name with a '/' (count/…, <class>.deviceclass.resource.k8s.io/devices,
// <class>.storageclass.storage.k8s.io/…) to stay silent on correct quotas.

var quotasGVR = metav1.GroupVersionResource{Version: "v1", Resource: "resourcequotas"}

// limitsPrefix is the quota name prefix of limits; k8s.io/api names only
// that of requests (corev1.DefaultResourceRequestsPrefix).
const limitsPrefix = "limits."

// quotaNamePattern is the RE2 form of unenforcedQuotaName's device plugin
// names for the webhook's matchCondition, so the API server calls the
// webhook only for quotas that get a warning.
var quotaNamePattern = `^(` + regexp.QuoteMeta(limitsPrefix) + `)?(` +
	regexp.QuoteMeta(vocabulary.ResourceGPU) + `(\..*)?|` + regexp.QuoteMeta(vocabulary.ResourceMIGPrefix) + `.*)$`

// QuotaNames returns the names of names that the quota warning must add to
// the device plugin's (vocabulary.IsDevicePluginResource), in order, without
// duplicates: what --quota-resource-names and the matchCondition carry.
func QuotaNames(names []string) []string {
	var out []string
	for _, n := range names {
		if n != "" && !vocabulary.IsDevicePluginResource(n) && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// quotaCondition is the CEL expression of the quota webhook's
// matchCondition: some key of spec.hard is unenforcedQuotaName. A raw
// string keeps the pattern's backslashes; the extra names (QuotaNames) are
// a JSON array, which is a CEL list of strings.
func quotaCondition(extra []string) string {
	test := fmt.Sprintf(`k.matches(r'%s')`, quotaNamePattern)
	if len(extra) > 0 {
		list, _ := json.Marshal(extra) // strings cannot fail
		test += fmt.Sprintf(` || %s.exists(n, k == n || k == '%s' + n)`, list, limitsPrefix)
	}
	return fmt.Sprintf(`object.?spec.?hard.orValue({}).exists(k, %s)`, test)
}

// unenforcedQuotaName returns the extended resource of a spec.hard key that
// the API server accepts but no quota evaluator counts, and whether it is
// one: a device plugin name or one of extra.
func unenforcedQuotaName(key string, extra []string) (string, bool) {
	name := strings.TrimPrefix(key, limitsPrefix)
	return name, vocabulary.IsDevicePluginResource(name) || slices.Contains(extra, name)
}

type quotaObject struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Hard map[string]json.RawMessage `json:"hard"`
	} `json:"spec"`
}

// quotaWarnings returns one warning per unenforced key of a quota, in key
// order: `spec.hard[nvidia.com/gpu]: not enforced (…); use requests.nvidia.com/gpu`.
func quotaWarnings(hard map[string]json.RawMessage, extra []string) []string {
	var warnings []string
	for _, key := range slices.Sorted(maps.Keys(hard)) {
		name, ok := unenforcedQuotaName(key, extra)
		if !ok {
			continue
		}
		warnings = append(warnings, fmt.Sprintf("%s: not enforced (quota counts extended resources only with the %q prefix); use %s%s",
			field.NewPath("spec", "hard").Key(key), corev1.DefaultResourceRequestsPrefix, corev1.DefaultResourceRequestsPrefix, name))
	}
	return warnings
}

// admitQuota admits a ResourceQuota, with warnings for its unenforced keys.
// A quota the webhook cannot read is admitted without warning: the webhook
// only advises on quotas, the API server validates them.
func (h *Handler) admitQuota(logger klog.Logger, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{Allowed: true}
	var obj quotaObject
	if err := json.Unmarshal(req.Object.Raw, &obj); err != nil {
		logger.V(2).Info("Undecodable ResourceQuota admitted without advice", "object", klog.KRef(req.Namespace, req.Name), "err", err)
		return resp
	}
	resp.Warnings = quotaWarnings(obj.Spec.Hard, h.quotaNames)
	if len(resp.Warnings) > 0 {
		logger.V(2).Info("ResourceQuota with unenforced GPU limits admitted with a warning", "object", klog.KRef(req.Namespace, objName(req, &obj)),
			"user", req.UserInfo.Username, "warnings", resp.Warnings)
	}
	return resp
}
