package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/deviceclass/extendedresourcecache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
	"github.com/gpu-dra/gpu-dra-driver/pkg/requesttranslation"
)

// MutatePath is where the Mutator is served; the mutating webhook
// configuration's clientConfig.service.path.
const MutatePath = "/mutate"

// The resources the Mutator translates.
var (
	podsGVR = metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
	jobsGVR = metav1.GroupVersionResource{Group: "batch.volcano.sh", Version: "v1alpha1", Resource: "jobs"}
	// Volcano Queues (cluster-scoped) are translated on create and update:
	// their quota changes while they live.
	queuesGVR = metav1.GroupVersionResource{Group: "scheduling.volcano.sh", Version: "v1beta1", Resource: "queues"}
)

// TranslationAnnotation is the annotation, under the driver name, in which
// the Mutator records what it changed: <driverName>/translated.
func TranslationAnnotation(driverName string) string { return driverName + "/translated" }

// TranslationConfig configures the Mutator.
type TranslationConfig struct {
	// Schedulers are the schedulerNames whose pods (and Volcano Jobs)
	// are translated.
	Schedulers []string
	// GangGuard: requesttranslation.Options.GangGuard.
	GangGuard bool
	// Classes is fed by an informer of DeviceClasses; it maps extended
	// resource names as kube-scheduler does.
	Classes *extendedresourcecache.ExtendedResourceCache
	// Client creates the ResourceClaimTemplates.
	Client kubernetes.Interface
}

// Mutator is the mutating admission webhook that translates device plugin
// requests into ResourceClaims for the configured schedulers
// (pkg/requesttranslation, docs/migration.md "Volcano").
type Mutator struct {
	driverName string
	cfg        TranslationConfig
	metrics    *metrics.Metrics
}

// NewMutator returns the mutating handler. m may be nil.
func NewMutator(driverName string, cfg TranslationConfig, m *metrics.Metrics) *Mutator {
	return &Mutator{driverName: driverName, cfg: cfg, metrics: metrics.OrNew(m)}
}

// ServeHTTP reads one AdmissionReview and answers it, with a JSON patch
// when the object changes.
func (h *Mutator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	serve(w, r, h.metrics, func(req *admissionv1.AdmissionRequest) string {
		if req.Resource == podsGVR || req.Resource == jobsGVR || req.Resource == queuesGVR {
			return req.Resource.Resource
		}
		return "unknown"
	}, func(req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, string) {
		return h.admit(r, req)
	})
}

// admit translates one request. reason is the rejection reason for the
// metrics, "" when allowed.
func (h *Mutator) admit(r *http.Request, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, string) {
	ctx := r.Context()
	logger := klog.FromContext(ctx)
	allowed := &admissionv1.AdmissionResponse{Allowed: true}
	if req.SubResource != "" || (req.Operation != admissionv1.Create && (req.Operation != admissionv1.Update || req.Resource != queuesGVR)) {
		return allowed, ""
	}
	opts := requesttranslation.Options{
		Classes: func(n corev1.ResourceName) string {
			if c := h.cfg.Classes.GetDeviceClass(n); c != nil {
				return c.Name
			}
			return ""
		},
		ServesClass: func(class string) bool {
			return h.cfg.Classes.GetDeviceClass(corev1.ResourceName(resourceapi.ResourceDeviceClassPrefix+class)) != nil
		},
		GangGuard: h.cfg.GangGuard,
	}
	annotation := TranslationAnnotation(h.driverName)
	var res requesttranslation.Result
	var err error
	switch req.Resource {
	case podsGVR:
		res, err = requesttranslation.Pod(req.Object.Raw, h.cfg.Schedulers, annotation, opts)
	case jobsGVR:
		res, err = requesttranslation.Job(req.Object.Raw, h.cfg.Schedulers, annotation, opts)
	case queuesGVR:
		var old []byte
		if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 {
			old = req.OldObject.Raw
		}
		res, err = requesttranslation.Queue(req.Object.Raw, old, annotation, opts.Classes)
	default:
		logger.Error(nil, "Admission request for a resource the mutating webhook does not handle; check the webhook configuration's rules",
			"resource", req.Resource, "name", req.Name, "namespace", req.Namespace)
		allowed.Warnings = []string{fmt.Sprintf("%s webhook: %s is not translated (webhook configuration error)", h.driverName, resourceString(req.Resource))}
		return allowed, ""
	}
	object := klog.KRef(req.Namespace, req.Name)
	if err != nil {
		return h.refuse(logger, req, err)
	}
	dryRun := req.DryRun != nil && *req.DryRun
	created, err := requesttranslation.Ensure(ctx, h.cfg.Client, req.Namespace, res.Templates, dryRun)
	h.metrics.RequestTranslationTemplates.Add(float64(len(created)))
	if err != nil {
		return h.refuse(logger, req, err)
	}
	if len(res.Patch) == 0 {
		return allowed, ""
	}
	patch, err := json.Marshal(res.Patch)
	if err != nil { // cannot happen with these types
		return denied(http.StatusInternalServerError, metav1.StatusReasonInternalError, fmt.Sprintf("encode patch: %v", err), nil), metrics.ReasonInvalid
	}
	h.metrics.RequestTranslations.WithLabelValues(req.Resource.Resource).Inc()
	logger.V(2).Info("Translated device requests", "resource", req.Resource.Resource, "object", object, "changes", res.Changes, "templatesCreated", created, "dryRun", dryRun)
	allowed.Patch = patch
	allowed.PatchType = ptr.To(admissionv1.PatchTypeJSONPatch)
	return allowed, ""
}

// refuse answers a failed translation: a refusal naming the field for bad
// input, an internal error for a failed API call.
func (h *Mutator) refuse(logger klog.Logger, req *admissionv1.AdmissionRequest, err error) (*admissionv1.AdmissionResponse, string) {
	logger.V(2).Info("Denied", "resource", req.Resource.Resource, "object", klog.KRef(req.Namespace, req.Name), "user", req.UserInfo.Username, "err", err)
	var e *requesttranslation.Error
	switch {
	case errors.As(err, &e):
		msg := fmt.Sprintf("%s: translating device requests for scheduler(s) %v: %v", h.driverName, h.cfg.Schedulers, err)
		if req.Resource == queuesGVR {
			msg = fmt.Sprintf("%s: translating the queue's device quota into DeviceClass quota: %v", h.driverName, err)
		}
		return denied(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, msg,
			[]metav1.StatusCause{{Type: metav1.CauseTypeFieldValueInvalid, Field: e.Field, Message: e.Message}}), metrics.ReasonInvalid
	case errors.Is(err, requesttranslation.ErrDecode):
		return denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error(), nil), metrics.ReasonDecode
	default:
		return denied(http.StatusInternalServerError, metav1.StatusReasonInternalError,
			fmt.Sprintf("%s: translating device requests: %v", h.driverName, err), nil), metrics.ReasonInternal
	}
}
