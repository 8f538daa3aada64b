// Package webhook is the validating admission webhook of the gpu.dra.dev
// driver. It checks the opaque configs addressed to the driver in
// ResourceClaims, ResourceClaimTemplates and DeviceClasses with the same
// opaqueconfig.DecodeDefaultValidate (this driver's API and NVIDIA's) the kubelet plugin runs at prepare,
// so a config that is admitted is a config the plugin accepts. Configs of
// other drivers are not looked at. ResourceQuotas that limit a device
// plugin resource name, or another extended resource name the driver's
// DeviceClasses serve, without the requests. prefix, which the API server
// accepts but never enforces, are admitted with a warning (quota.go).
// Beside it, the Mutator (mutate.go) is the mutating webhook of the request
// translation for schedulers that cannot read DRA extended resources.
package webhook

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
)

// Path is where the handler is served; the webhook configuration's
// clientConfig.service.path.
const Path = "/validate"

// maxRequestBytes bounds a review: an object and its old version, each at
// most the API server's request limit of 3 MiB, plus the review around them.
const maxRequestBytes = 7 << 20

// resourceGroup is the API group whose resources the webhook validates.
const resourceGroup = "resource.k8s.io"

// Handler answers admission.k8s.io/v1 AdmissionReviews.
type Handler struct {
	driverName string
	metrics    *metrics.Metrics
	quotaNames []string // QuotaNames of the served extended resources
}

// NewHandler returns a handler that validates the configs addressed to
// driverName. m may be nil. quotaNames are the extended resource names the
// driver's DeviceClasses serve, whose unenforced quota keys are warned
// about besides the device plugin's (quota.go).
func NewHandler(driverName string, m *metrics.Metrics, quotaNames ...string) *Handler {
	return &Handler{driverName: driverName, metrics: metrics.OrNew(m), quotaNames: QuotaNames(quotaNames)}
}

// ServeHTTP reads one AdmissionReview and writes the answer. A request that
// is not a readable AdmissionReview gets a 4xx status without a review; the
// API server then applies the webhook's failurePolicy.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	logger := klog.FromContext(r.Context())
	serve(w, r, h.metrics, resourceLabel, func(req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, string) {
		return h.admit(logger, req)
	})
}

// serve reads one AdmissionReview, answers it with admit (which returns the
// response and the rejection reason for the metrics, "" when allowed), and
// records the metrics under label's resource label of the request.
func serve(w http.ResponseWriter, r *http.Request, m *metrics.Metrics, label func(*admissionv1.AdmissionRequest) string,
	admit func(*admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, string)) {
	start := time.Now()
	review, status, err := readReview(w, r)
	if err != nil {
		klog.FromContext(r.Context()).V(2).Info("Bad admission request", "remote", r.RemoteAddr, "err", err)
		m.AdmissionRejections.WithLabelValues("unknown", metrics.ReasonBadRequest).Inc()
		m.AdmissionDuration.WithLabelValues("unknown", "false").Observe(time.Since(start).Seconds())
		http.Error(w, err.Error(), status)
		return
	}
	req := review.Request
	resp, reason := admit(req)
	resp.UID = req.UID
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}

	resource := label(req)
	if reason != "" {
		m.AdmissionRejections.WithLabelValues(resource, reason).Inc()
	}
	body, err := json.Marshal(&out)
	if err != nil { // cannot happen with these types
		http.Error(w, fmt.Sprintf("encode review: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
	m.AdmissionDuration.WithLabelValues(resource, strconv.FormatBool(resp.Allowed)).Observe(time.Since(start).Seconds())
}

// readReview reads and checks the request; on error it also returns the
// HTTP status to answer with.
func readReview(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, int, error) {
	if r.Method != http.MethodPost {
		return nil, http.StatusMethodNotAllowed, fmt.Errorf("method %s: only POST is served", r.Method)
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return nil, http.StatusUnsupportedMediaType, fmt.Errorf("content type %q: only application/json is served", ct)
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	if err != nil {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("read request: %w", err)
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("decode AdmissionReview: %w", err)
	}
	if gvk := review.GroupVersionKind(); gvk != admissionv1.SchemeGroupVersion.WithKind("AdmissionReview") {
		return nil, http.StatusBadRequest, fmt.Errorf("got apiVersion %q kind %q, want %s AdmissionReview (list %q in admissionReviewVersions)",
			review.APIVersion, review.Kind, admissionv1.SchemeGroupVersion, "v1")
	}
	if review.Request == nil {
		return nil, http.StatusBadRequest, fmt.Errorf("AdmissionReview has no request")
	}
	return &review, 0, nil
}

// admit decides one request. reason is the rejection reason for the
// metrics, "" when allowed.
func (h *Handler) admit(logger klog.Logger, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, string) {
	allowed := &admissionv1.AdmissionResponse{Allowed: true}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return allowed, ""
	}
	if req.SubResource != "" { // e.g. resourceclaims/status, written by the scheduler
		return allowed, ""
	}
	if req.Resource == quotasGVR {
		return h.admitQuota(logger, req), ""
	}
	kind, ok := kinds[req.Resource.Resource]
	if !ok || req.Resource.Group != resourceGroup {
		// The webhook configuration's rules send something this webhook
		// does not handle. Blocking it would break an unrelated API, so it
		// is admitted, with a warning the client shows.
		logger.Error(nil, "Admission request for a resource the webhook does not handle; check the webhook configuration's rules",
			"resource", req.Resource, "name", req.Name, "namespace", req.Namespace)
		allowed.Warnings = []string{fmt.Sprintf("%s webhook: %s is not validated (webhook configuration error)", h.driverName, resourceString(req.Resource))}
		return allowed, ""
	}
	obj, configs, err := kind.configs(req.Object.Raw)
	if err != nil {
		return denied(http.StatusBadRequest, metav1.StatusReasonBadRequest,
			fmt.Sprintf("decode %s: %v", resourceString(req.Resource), err), nil), metrics.ReasonBadRequest
	}
	var old []located
	if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 {
		if _, old, err = kind.configs(req.OldObject.Raw); err != nil {
			old = nil // validate everything
		}
	}
	problems := checkConfigs(h.driverName, configs, old)
	if len(problems) == 0 {
		logger.V(5).Info("Admitted", "resource", req.Resource.Resource, "object", klog.KRef(req.Namespace, objName(req, obj)), "configs", len(configs))
		if req.Operation == admissionv1.Create { // not again on every finalizer update
			allowed.Warnings = wholeGPUSharingWarnings(h.driverName, req.Resource.Resource, req.Object.Raw)
		}
		return allowed, ""
	}
	msgs := make([]string, 0, len(problems))
	var causes []metav1.StatusCause
	for _, p := range problems {
		msgs = append(msgs, p.message)
		causes = append(causes, p.causes...)
	}
	msg := strings.Join(msgs, "; ")
	logger.V(2).Info("Denied", "resource", req.Resource.Resource, "object", klog.KRef(req.Namespace, objName(req, obj)),
		"user", req.UserInfo.Username, "reason", msg)
	return denied(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, msg, causes), problems[0].reason
}

func denied(code int32, reason metav1.StatusReason, msg string, causes []metav1.StatusCause) *admissionv1.AdmissionResponse {
	status := &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg}
	if len(causes) > 0 {
		status.Details = &metav1.StatusDetails{Causes: causes}
	}
	return &admissionv1.AdmissionResponse{Allowed: false, Result: status}
}

// objName is the object's name; generateName when the API server has not
// named it yet (it calls admission before it fills in the name).
func objName(req *admissionv1.AdmissionRequest, obj interface{ GetGenerateName() string }) string {
	if req.Name != "" {
		return req.Name
	}
	return obj.GetGenerateName()
}

func resourceString(r metav1.GroupVersionResource) string {
	if r.Group == "" {
		return r.Version + "/" + r.Resource
	}
	return r.Resource + "." + r.Version + "." + r.Group
}

// resourceLabel is the metrics label of a request's resource: bounded to
// the handled resources.
func resourceLabel(req *admissionv1.AdmissionRequest) string {
	if req.Resource == quotasGVR {
		return quotasGVR.Resource
	}
	if _, ok := kinds[req.Resource.Resource]; ok && req.Resource.Group == resourceGroup {
		return req.Resource.Resource
	}
	return "unknown"
}
