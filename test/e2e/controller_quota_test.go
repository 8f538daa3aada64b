package e2e

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// warnings collects the API server's warnings to a client.
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

// take returns the warnings collected since the last take.
func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.list
	w.list = nil
	return l
}

// TestControllerQuotaWarning: a ResourceQuota written as GPU guides for the
// device plugin teach, hard: {nvidia.com/gpu: 8}, is accepted by the API
// server but never enforced; the dra-controller's webhook answers it with a
// warning naming spec.hard[nvidia.com/gpu] and requests.nvidia.com/gpu, and
// the quota is created. A requests.nvidia.com/gpu quota gets no warning.
func TestControllerQuotaWarning(t *testing.T) {
	ctx := testContext(t)
	waitController(t, ctx)
	ns := newNamespace(t, ctx, "e2e-quota-warning")
	w := &warnings{}
	cfg := rest.CopyConfig(env.cluster.Config)
	cfg.WarningHandler = w
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	quota := func(name, key string) *corev1.ResourceQuota {
		return &corev1.ResourceQuota{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourceName(key): resource.MustParse("8")}},
		}
	}
	guide := quota("guide", vocabulary.ResourceGPU)
	wantField := "spec.hard[" + vocabulary.ResourceGPU + "]"
	wantFix := "use requests." + vocabulary.ResourceGPU
	hasWarning := func(ws []string) bool {
		return slices.ContainsFunc(ws, func(s string) bool { return strings.Contains(s, wantField) && strings.Contains(s, wantFix) })
	}

	// The webhook's endpoint may lag the rollout, and under failurePolicy
	// Ignore a quota is then admitted silently: dry-run until it warns.
	var last []string
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().ResourceQuotas(ns).Create(ctx, guide, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		last = w.take()
		return err == nil && hasWarning(last), err
	}); err != nil {
		t.Fatalf("no warning for a dry-run %s quota: %v; warnings %q", vocabulary.ResourceGPU, err, last)
	}

	if _, err := c.CoreV1().ResourceQuotas(ns).Create(ctx, guide, metav1.CreateOptions{}); err != nil {
		t.Fatalf("quota %s refused: %v", vocabulary.ResourceGPU, err)
	}
	if got := w.take(); !hasWarning(got) {
		t.Errorf("creating the %s quota: warnings %q, want one naming %s and %q", vocabulary.ResourceGPU, got, wantField, wantFix)
	}
	if _, err := c.CoreV1().ResourceQuotas(ns).Get(ctx, guide.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("quota %s not created: %v", vocabulary.ResourceGPU, err)
	}

	if _, err := c.CoreV1().ResourceQuotas(ns).Create(ctx, quota("fixed", "requests."+vocabulary.ResourceGPU), metav1.CreateOptions{}); err != nil {
		t.Fatalf("quota requests.%s refused: %v", vocabulary.ResourceGPU, err)
	}
	if got := w.take(); len(got) != 0 {
		t.Errorf("creating the requests.%s quota: warnings %q, want none", vocabulary.ResourceGPU, got)
	}
}
