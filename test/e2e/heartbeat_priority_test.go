package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// The API server's response headers that name the FlowSchema and priority
// level a request was classified into (API Priority and Fairness).
const (
	headerFlowSchemaUID    = "X-Kubernetes-PF-FlowSchema-UID"
	headerPriorityLevelUID = "X-Kubernetes-PF-PriorityLevel-UID"
)

// headerRecorder keeps the response headers of the last request.
type headerRecorder struct {
	rt   http.RoundTripper
	mu   sync.Mutex
	last http.Header
}

func (h *headerRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := h.rt.RoundTrip(req)
	if resp != nil {
		h.mu.Lock()
		h.last = resp.Header.Clone()
		h.mu.Unlock()
	}
	return resp, err
}

func (h *headerRecorder) get(name string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last.Get(name)
}

// TestHeartbeatPriorityLevel: the real API server accepts the chart's
// FlowSchema and PriorityLevelConfiguration for the heartbeat (not
// dangling; Limited, nothing lent), and classifies the plugin service
// account's requests for its node's heartbeat Lease into them, and nothing
// else the plugin asks for.
func TestHeartbeatPriorityLevel(t *testing.T) {
	ctx := testContext(t)
	c := env.cluster.Client
	fss, err := c.FlowcontrolV1().FlowSchemas().List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + env.release})
	if err != nil || len(fss.Items) != 1 {
		t.Fatalf("want the heartbeat FlowSchema of release %s (kubeletPlugin.heartbeatPriority.enabled): %v (%d)", env.release, err, len(fss.Items))
	}
	fs := &fss.Items[0]
	// The API server's config controller reports whether the level exists.
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		got, err := c.FlowcontrolV1().FlowSchemas().Get(ctx, fs.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		fs = got
		for _, cond := range fs.Status.Conditions {
			if cond.Type == flowcontrolv1.FlowSchemaConditionDangling {
				return cond.Status == flowcontrolv1.ConditionFalse, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("FlowSchema %s not accepted (dangling or no status): %v; status %+v", fs.Name, err, fs.Status)
	}
	pl, err := c.FlowcontrolV1().PriorityLevelConfigurations().Get(ctx, fs.Spec.PriorityLevelConfiguration.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the FlowSchema's priority level: %v", err)
	}
	if pl.Spec.Type != flowcontrolv1.PriorityLevelEnablementLimited || pl.Spec.Limited == nil ||
		pl.Spec.Limited.LendablePercent == nil || *pl.Spec.Limited.LendablePercent != 0 {
		t.Errorf("priority level %s: %+v, want Limited, lendablePercent 0", pl.Name, pl.Spec)
	}

	rec := &headerRecorder{}
	cfg := pluginConfig(env.node)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { rec.rt = rt; return rec })
	plugin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	leases := plugin.CoordinationV1().Leases(env.namespace)
	classified := func(what string, wantHeartbeat bool) {
		t.Helper()
		gotFS, gotPL := rec.get(headerFlowSchemaUID), rec.get(headerPriorityLevelUID)
		t.Logf("%s: FlowSchema UID %q, priority level UID %q", what, gotFS, gotPL)
		if isHeartbeat := gotFS == string(fs.UID) && gotPL == string(pl.UID); isHeartbeat != wantHeartbeat {
			t.Errorf("%s: classified into FlowSchema %q, level %q; heartbeat FlowSchema %s (%s), level %s (%s): want it %v",
				what, gotFS, gotPL, fs.Name, fs.UID, pl.Name, pl.UID, wantHeartbeat)
		}
	}

	// A renewal, dry run: admitted (its own node's Lease) and classified. The
	// plugin renews too: a conflict is retried with the Lease read again.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lease, err := leases.Get(ctx, vocabulary.HeartbeatLeaseName(env.node), metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get: %w", err)
		}
		classified("get of the heartbeat Lease", true)
		_, err = leases.Update(ctx, lease, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})
	if err != nil {
		t.Fatalf("renew the heartbeat Lease as the plugin (dry run): %v", err)
	}
	classified("update of the heartbeat Lease", true)
	// The plugin's other requests keep their usual level.
	if _, err := plugin.CoreV1().Nodes().Get(ctx, env.node, metav1.GetOptions{}); err != nil {
		t.Fatalf("get its Node as the plugin: %v", err)
	}
	classified("get of its Node", false)
}
