// Package certs provides the webhook's serving certificate, either
// self-managed (Manager: a CA and a serving certificate kept in a Secret,
// rotated before they expire, with the CA bundle patched into the
// Validating- and MutatingWebhookConfiguration) or read from files that cert-manager
// writes (FileSource).
package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
)

// Source provides the serving certificate of the webhook server.
type Source interface {
	// GetCertificate is tls.Config.GetCertificate.
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Ready reports whether a certificate is loaded.
	Ready() error
	// Run keeps the certificate current until ctx is done.
	Run(ctx context.Context) error
}

// Defaults of Config.
const (
	DefaultCAValidity       = 3 * 365 * 24 * time.Hour
	DefaultCertValidity     = 90 * 24 * time.Hour
	DefaultPropagationDelay = 5 * time.Minute
	// resync bounds the time between two checks when nothing happens.
	resync = time.Hour
)

// ManagedByLabel marks the Secret as written by the controller.
const ManagedByLabel = "app.kubernetes.io/managed-by"

// ManagedByValue is the value of ManagedByLabel on what the controller writes.
const ManagedByValue = "gpu-dra-controller"

// Config configures a Manager.
type Config struct {
	// Namespace and SecretName name the Secret holding the CA and the
	// serving certificate.
	Namespace  string
	SecretName string
	// WebhookConfigName is the ValidatingWebhookConfiguration whose
	// webhooks get the CA bundle; empty leaves the bundle to someone else.
	WebhookConfigName string
	// MutatingWebhookConfigName is the MutatingWebhookConfiguration
	// (request translation) whose webhooks get the CA bundle too; empty:
	// none.
	MutatingWebhookConfigName string
	// DNSNames are the serving certificate's names: the webhook Service's
	// (see ServiceDNSNames).
	DNSNames []string
	// CAValidity and CertValidity are the lifetimes of new certificates;
	// each is renewed after two thirds of it.
	CAValidity   time.Duration
	CertValidity time.Duration
	// PropagationDelay is how long a new CA is in the bundle before
	// serving certificates signed by it are used, so that the API server
	// already trusts them.
	PropagationDelay time.Duration
	Clock            clock.Clock
	Metrics          *metrics.Metrics
}

// ServiceDNSNames are the names under which the API server reaches a
// Service: name, name.namespace, name.namespace.svc and the fully
// qualified name in clusterDomain.
func ServiceDNSNames(service, namespace, clusterDomain string) []string {
	names := []string{service, service + "." + namespace, service + "." + namespace + ".svc"}
	if clusterDomain != "" {
		names = append(names, service+"."+namespace+".svc."+clusterDomain)
	}
	return names
}

// Manager keeps a self-signed CA and a serving certificate in a Secret.
// Every replica runs one: they agree through the Secret's resourceVersion
// (a losing writer re-reads and serves the winner's certificate), so
// serving does not depend on leader election.
type Manager struct {
	client  kubernetes.Interface
	cfg     Config
	current atomic.Pointer[tls.Certificate]
	trigger chan struct{}
}

// NewManager returns a Manager; Run or Reconcile loads the certificate.
func NewManager(client kubernetes.Interface, cfg Config) (*Manager, error) {
	if cfg.Namespace == "" || cfg.SecretName == "" {
		return nil, errors.New("self-managed TLS needs a namespace and a Secret name")
	}
	if len(cfg.DNSNames) == 0 {
		return nil, errors.New("self-managed TLS needs the webhook Service's DNS names")
	}
	if cfg.CAValidity == 0 {
		cfg.CAValidity = DefaultCAValidity
	}
	if cfg.CertValidity == 0 {
		cfg.CertValidity = DefaultCertValidity
	}
	if cfg.CertValidity > cfg.CAValidity {
		return nil, fmt.Errorf("certificate validity %v is longer than the CA's %v", cfg.CertValidity, cfg.CAValidity)
	}
	if cfg.PropagationDelay == 0 {
		cfg.PropagationDelay = DefaultPropagationDelay
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	cfg.Metrics = metrics.OrNew(cfg.Metrics)
	return &Manager{client: client, cfg: cfg, trigger: make(chan struct{}, 1)}, nil
}

// GetCertificate returns the current serving certificate.
func (m *Manager) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := m.current.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("no serving certificate yet")
}

// Ready reports whether a serving certificate is loaded.
func (m *Manager) Ready() error {
	if m.current.Load() == nil {
		return errors.New("serving certificate not loaded yet")
	}
	return nil
}

// Reconcile makes the Secret hold a current CA and serving certificate,
// puts the CA bundle into the webhook configuration and loads the serving
// certificate. It returns when to reconcile again.
func (m *Manager) Reconcile(ctx context.Context) (time.Duration, error) {
	logger := klog.FromContext(ctx)
	now := m.cfg.Clock.Now()

	secret, err := m.client.CoreV1().Secrets(m.cfg.Namespace).Get(ctx, m.cfg.SecretName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		secret = nil
	} else if err != nil {
		return 0, fmt.Errorf("get Secret %s/%s: %w", m.cfg.Namespace, m.cfg.SecretName, err)
	}
	var cur *state
	if secret != nil {
		var problems []string
		cur, problems = parseState(secret.Data)
		if len(problems) > 0 {
			logger.Info("Ignoring unusable TLS material in Secret", "secret", klog.KObj(secret), "problems", problems)
		}
	}

	// Until the API server has been given the active CA, serving
	// certificates stay on the CA it already trusts.
	installed := true
	var bundleErr error
	if m.hasBundleTargets() && cur != nil && len(cur.cas) > 0 {
		installed, bundleErr = m.bundleInstalled(ctx, cur.cas[0].Raw)
	}
	plan, err := m.cfg.plan(cur, planInput{now: now, dnsNames: m.cfg.DNSNames, caInstalled: installed})
	if err != nil {
		return 0, err
	}
	if plan.changed {
		if err := m.writeSecret(ctx, secret, plan.next); err != nil {
			return 0, err
		}
		if plan.newCA {
			m.cfg.Metrics.CertRotations.WithLabelValues("ca").Inc()
		}
		if plan.newServing {
			m.cfg.Metrics.CertRotations.WithLabelValues("serving").Inc()
		}
		logger.Info("Updated webhook TLS Secret", "secret", klog.KRef(m.cfg.Namespace, m.cfg.SecretName),
			"reasons", plan.reasons, "newCA", plan.newCA, "newServingCert", plan.newServing,
			"servingNotAfter", plan.next.serving.cert.NotAfter)
	}
	// Serve first: a missing or unwritable webhook configuration must not
	// keep the server from becoming ready.
	if err := m.load(plan.next.serving); err != nil {
		return 0, err
	}
	if m.hasBundleTargets() {
		bundle, err := certutil.EncodeCertificates(plan.next.cas...)
		if err != nil {
			return 0, fmt.Errorf("encode CA bundle: %w", err)
		}
		bundleErr = m.patchBundle(ctx, bundle)
	}
	if bundleErr != nil {
		return 0, bundleErr
	}
	after := plan.recheckAt.Sub(now)
	return min(max(after, time.Second), resync), nil
}

func (m *Manager) load(pair *keyPair) error {
	if c := m.current.Load(); c != nil && bytes.Equal(c.Certificate[0], pair.cert.Raw) {
		return nil
	}
	c, err := tls.X509KeyPair(pair.certPEM, pair.keyPEM)
	if err != nil {
		return fmt.Errorf("load serving certificate: %w", err)
	}
	m.current.Store(&c)
	m.cfg.Metrics.ServingCertExpiry.Set(float64(pair.cert.NotAfter.Unix()))
	return nil
}

// writeSecret creates or updates the Secret. A conflict means another
// replica wrote first; the next reconcile reads its result.
func (m *Manager) writeSecret(ctx context.Context, existing *corev1.Secret, s *state) error {
	data, err := s.data()
	if err != nil {
		return err
	}
	if existing == nil {
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name: m.cfg.SecretName, Namespace: m.cfg.Namespace,
				Labels: map[string]string{ManagedByLabel: ManagedByValue},
			},
			Type: corev1.SecretTypeTLS,
			Data: data,
		}
		_, err := m.client.CoreV1().Secrets(m.cfg.Namespace).Create(ctx, secret, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create Secret %s/%s: %w", m.cfg.Namespace, m.cfg.SecretName, err)
		}
		return nil
	}
	secret := existing.DeepCopy()
	if secret.Labels == nil {
		secret.Labels = map[string]string{}
	}
	secret.Labels[ManagedByLabel] = ManagedByValue
	secret.Data = data
	if _, err := m.client.CoreV1().Secrets(m.cfg.Namespace).Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update Secret %s/%s: %w", m.cfg.Namespace, m.cfg.SecretName, err)
	}
	return nil
}

func (m *Manager) hasBundleTargets() bool {
	return m.cfg.WebhookConfigName != "" || m.cfg.MutatingWebhookConfigName != ""
}

// bundleTarget is one webhook configuration that gets the CA bundle: its
// kind and name, and how to read and write it.
type bundleTarget struct {
	kind, name string
	// clientConfigs returns the client configs of the current object,
	// for reading and changing in place.
	clientConfigs func(ctx context.Context) ([]*admissionregistrationv1.WebhookClientConfig, error)
	// update writes the object clientConfigs last returned.
	update func(ctx context.Context) error
}

// configTarget is the bundleTarget of a webhook configuration of type T.
func configTarget[T any](kind, name string,
	get func(context.Context, string, metav1.GetOptions) (T, error),
	update func(context.Context, T, metav1.UpdateOptions) (T, error),
	clientConfigs func(T) []*admissionregistrationv1.WebhookClientConfig) bundleTarget {
	var current T
	return bundleTarget{
		kind: kind, name: name,
		clientConfigs: func(ctx context.Context) ([]*admissionregistrationv1.WebhookClientConfig, error) {
			obj, err := get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("get %s %s: %w", kind, name, err)
			}
			current = obj
			return clientConfigs(obj), nil
		},
		update: func(ctx context.Context) error {
			if _, err := update(ctx, current, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("update CA bundle of %s %s: %w", kind, name, err)
			}
			return nil
		},
	}
}

// bundleTargets are the webhook configurations that get the CA bundle.
func (m *Manager) bundleTargets() []bundleTarget {
	var targets []bundleTarget
	api := m.client.AdmissionregistrationV1()
	if name := m.cfg.WebhookConfigName; name != "" {
		targets = append(targets, configTarget("ValidatingWebhookConfiguration", name,
			api.ValidatingWebhookConfigurations().Get, api.ValidatingWebhookConfigurations().Update,
			func(c *admissionregistrationv1.ValidatingWebhookConfiguration) []*admissionregistrationv1.WebhookClientConfig {
				var out []*admissionregistrationv1.WebhookClientConfig
				for i := range c.Webhooks {
					out = append(out, &c.Webhooks[i].ClientConfig)
				}
				return out
			}))
	}
	if name := m.cfg.MutatingWebhookConfigName; name != "" {
		targets = append(targets, configTarget("MutatingWebhookConfiguration", name,
			api.MutatingWebhookConfigurations().Get, api.MutatingWebhookConfigurations().Update,
			func(c *admissionregistrationv1.MutatingWebhookConfiguration) []*admissionregistrationv1.WebhookClientConfig {
				var out []*admissionregistrationv1.WebhookClientConfig
				for i := range c.Webhooks {
					out = append(out, &c.Webhooks[i].ClientConfig)
				}
				return out
			}))
	}
	return targets
}

// bundleInstalled reports whether every webhook of the configurations
// trusts the CA (DER).
func (m *Manager) bundleInstalled(ctx context.Context, caDER []byte) (bool, error) {
	for _, t := range m.bundleTargets() {
		ccs, err := t.clientConfigs(ctx)
		if err != nil {
			return false, err
		}
		for _, cc := range ccs {
			cas, err := certutil.ParseCertsPEM(cc.CABundle)
			if err != nil {
				return false, nil
			}
			found := false
			for _, c := range cas {
				found = found || bytes.Equal(c.Raw, caDER)
			}
			if !found {
				return false, nil
			}
		}
	}
	return true, nil
}

// patchBundle sets the CA bundle of every webhook of the configurations.
func (m *Manager) patchBundle(ctx context.Context, bundle []byte) error {
	for _, t := range m.bundleTargets() {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			ccs, err := t.clientConfigs(ctx)
			if err != nil {
				return err
			}
			changed := false
			for _, cc := range ccs {
				if !bytes.Equal(cc.CABundle, bundle) {
					cc.CABundle = bundle
					changed = true
				}
			}
			if !changed {
				return nil
			}
			if err := t.update(ctx); err != nil {
				return err
			}
			klog.FromContext(ctx).Info("Updated CA bundle", "kind", t.kind, "name", t.name, "webhooks", len(ccs))
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Run reconciles when the Secret or the webhook configuration changes, when
// a certificate is due, and at least hourly, until ctx is done. Failures
// are retried with exponential backoff up to a minute.
func (m *Manager) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	notify := func() {
		select {
		case m.trigger <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}
	byName := func(name string) informers.SharedInformerOption {
		return informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		})
	}
	secrets := informers.NewSharedInformerFactoryWithOptions(m.client, 0,
		informers.WithNamespace(m.cfg.Namespace), byName(m.cfg.SecretName))
	if _, err := secrets.Core().V1().Secrets().Informer().AddEventHandler(handler); err != nil {
		return err
	}
	secrets.Start(ctx.Done())
	defer secrets.Shutdown()
	if m.cfg.WebhookConfigName != "" {
		vwcs := informers.NewSharedInformerFactoryWithOptions(m.client, 0, byName(m.cfg.WebhookConfigName))
		informer := vwcs.Admissionregistration().V1().ValidatingWebhookConfigurations().Informer()
		if _, err := informer.AddEventHandler(handler); err != nil {
			return err
		}
		vwcs.Start(ctx.Done())
		defer vwcs.Shutdown()
	}
	if m.cfg.MutatingWebhookConfigName != "" {
		mwcs := informers.NewSharedInformerFactoryWithOptions(m.client, 0, byName(m.cfg.MutatingWebhookConfigName))
		informer := mwcs.Admissionregistration().V1().MutatingWebhookConfigurations().Informer()
		if _, err := informer.AddEventHandler(handler); err != nil {
			return err
		}
		mwcs.Start(ctx.Done())
		defer mwcs.Shutdown()
	}

	backoff := time.Second
	for {
		wait, err := m.Reconcile(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			logger.Error(err, "Reconciling webhook TLS failed", "retryIn", backoff)
			wait = backoff
			backoff = min(2*backoff, time.Minute)
		} else {
			backoff = time.Second
		}
		timer := m.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-m.trigger:
		case <-timer.C():
		}
		timer.Stop()
	}
}

var _ Source = &Manager{}
