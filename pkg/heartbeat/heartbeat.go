// Package heartbeat renews a node's heartbeat Lease while the kubelet plugin
// serves. The kubelet keeps the ResourceSlices of a registered plugin even
// when it no longer answers (a hung NVML call, a deadlock, a stopped
// process), so the scheduler keeps sending pods there; dra-controller
// (pkg/controller/nodeoutage) taints the node's devices when the Lease
// lapses. The Lease is renewed only after a round trip through the plugin's
// own serving path passed (Serving, pkg/liveness' checks of the DRA socket
// and NVML): a process that is alive but does not serve renews nothing.
package heartbeat

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// DefaultPeriod is how often the Lease is renewed, as the kubelet renews
// its node Lease.
const DefaultPeriod = 10 * time.Second

// Options configure a Heartbeat.
type Options struct {
	Client coordinationclient.LeasesGetter
	// Namespace holds the Lease: the plugin's own.
	Namespace string
	NodeName  string
	// Holder is written as the Lease's holderIdentity: the plugin's pod.
	Holder string
	// Period is the time between renewals; the Lease says it lasts four.
	Period time.Duration
	// Serving returns nil while the plugin serves; the Lease is renewed
	// only then. It must return promptly (liveness.Prober.Passing does).
	Serving func() error
}

// Heartbeat renews one node's Lease.
type Heartbeat struct {
	opts Options
	name string
	// lease is the latest Lease read or written; nil: read it first.
	lease *coordinationv1.Lease
	// notServing is the reason of the latest skipped renewal ("" when the
	// latest round renewed), to log only changes; served says whether the
	// plugin ever served (before, a failed check is the start, not news).
	notServing string
	served     bool
}

// New checks opts and returns a Heartbeat; it writes nothing before Run.
func New(opts Options) (*Heartbeat, error) {
	name := vocabulary.HeartbeatLeaseName(opts.NodeName)
	switch {
	case opts.Client == nil || opts.Serving == nil:
		return nil, errors.New("heartbeat: needs a client and a Serving function")
	case opts.Namespace == "":
		return nil, errors.New("heartbeat: no namespace for the Lease (--pod-namespace)")
	case opts.NodeName == "":
		return nil, errors.New("heartbeat: no node name")
	case opts.Period <= 0:
		return nil, fmt.Errorf("heartbeat period %s: must be positive", opts.Period)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return nil, fmt.Errorf("heartbeat Lease name %q of node %q: %s", name, opts.NodeName, strings.Join(errs, "; "))
	}
	return &Heartbeat{opts: opts, name: name}, nil
}

// LeaseName is the name of the Lease the heartbeat renews.
func (h *Heartbeat) LeaseName() string { return h.name }

// Run renews the Lease every period while Serving passes, until ctx ends.
func (h *Heartbeat) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithValues("lease", klog.KRef(h.opts.Namespace, h.name))
	ctx = klog.NewContext(ctx, logger)
	logger.Info("Renewing the heartbeat Lease while the plugin serves", "period", h.opts.Period)
	t := time.NewTicker(h.opts.Period)
	defer t.Stop()
	for {
		h.beat(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// beat renews the Lease once if the plugin serves.
func (h *Heartbeat) beat(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if err := h.opts.Serving(); err != nil {
		switch reason := err.Error(); {
		case !h.served: // starting: the first checks have not passed yet
			logger.V(2).Info("Not serving yet: heartbeat Lease not renewed", "reason", reason)
		case reason != h.notServing:
			logger.Error(err, "Not serving: heartbeat Lease not renewed; dra-controller taints this node's devices when it lapses")
			h.notServing = reason
		}
		return
	}
	h.served = true
	if h.notServing != "" {
		logger.Info("Serving again: renewing the heartbeat Lease")
		h.notServing = ""
	}
	// A renewal that takes longer than a period is as good as missed.
	ctx, cancel := context.WithTimeout(ctx, h.opts.Period)
	defer cancel()
	if err := h.renew(ctx); err != nil {
		h.lease = nil // read it afresh next time
		logger.Error(err, "Renewing the heartbeat Lease failed; retrying next period")
	}
}

// renew writes renewTime = now (and the holder and duration) into the
// Lease, creating it when it does not exist.
func (h *Heartbeat) renew(ctx context.Context) error {
	leases := h.opts.Client.Leases(h.opts.Namespace)
	if h.lease == nil {
		l, err := leases.Get(ctx, h.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			created, err := leases.Create(ctx, h.desired(&coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: h.name, Namespace: h.opts.Namespace},
			}), metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("create Lease %s/%s: %w", h.opts.Namespace, h.name, err)
			}
			h.lease = created
			return nil
		case err != nil:
			return fmt.Errorf("get Lease %s/%s: %w", h.opts.Namespace, h.name, err)
		}
		h.lease = l
	}
	updated, err := leases.Update(ctx, h.desired(h.lease.DeepCopy()), metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("update Lease %s/%s: %w", h.opts.Namespace, h.name, err)
	}
	h.lease = updated
	return nil
}

// desired sets what the heartbeat owns in l and returns it.
func (h *Heartbeat) desired(l *coordinationv1.Lease) *coordinationv1.Lease {
	now := metav1.NewMicroTime(time.Now())
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[vocabulary.LabelHeartbeat] = "true"
	if ptr.Deref(l.Spec.HolderIdentity, "") != h.opts.Holder || l.Spec.AcquireTime == nil {
		l.Spec.HolderIdentity = ptr.To(h.opts.Holder)
		l.Spec.AcquireTime = &now
	}
	l.Spec.LeaseDurationSeconds = ptr.To(int32(min(math.MaxInt32, math.Ceil(4*h.opts.Period.Seconds()))))
	l.Spec.RenewTime = &now
	return l
}
