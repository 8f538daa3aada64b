// Package controller runs the cluster-wide dra-controller of the
// gpu.dra.dev driver: the validating admission webhook for opaque GPU
// configs (every replica serves it), and, under leader election, the
// GFD-compatible node labels and the per-model DeviceClasses. The command
// in cmd/dra-controller only parses flags into a Config and calls Run.
package controller

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"k8s.io/apimachinery/pkg/util/validation"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/certs"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/computedomain"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/imexchannels"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/modelclasses"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/nodeoutage"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubeclient"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Config is everything the controller needs to run.
type Config struct {
	DriverName string
	// Namespace holds the leader election Lease and the self-managed TLS
	// Secret: the controller's own namespace.
	Namespace string

	// The API client's --kubeconfig, --kube-api-qps and --kube-api-burst.
	kubeclient.Options

	// HTTPAddress serves /healthz, /readyz and /metrics over plain HTTP.
	HTTPAddress string

	Webhook WebhookConfig
	// RequestTranslation configures the mutating webhook that turns device
	// plugin requests into ResourceClaims for schedulers that cannot read
	// DRA extended resources (served beside the validating webhook).
	RequestTranslation RequestTranslationConfig

	// NodeLabels enables the GFD-compatible node labels.
	NodeLabels bool
	// ModelDeviceClasses enables one DeviceClass per GPU model,
	// MIGProfileDeviceClasses one per MIG profile serving the device
	// plugin's nvidia.com/mig-<profile> (docs/migration.md).
	ModelDeviceClasses      bool
	MIGProfileDeviceClasses bool
	// ModelDeviceClassGracePeriod is how long a model must be gone before
	// its class is deleted.
	ModelDeviceClassGracePeriod time.Duration
	// Workers is the number of node label workers.
	Workers int
	// Outage taints the devices of nodes whose plugin stopped renewing its
	// heartbeat Lease (in Namespace) for OutageGracePeriod; NoExecute after
	// OutageNoExecuteAfter when positive (pkg/controller/nodeoutage).
	Outage               bool
	OutageGracePeriod    time.Duration
	OutageNoExecuteAfter time.Duration
	// OutageMassLapse* hold escalation back when many nodes lapse at once
	// (nodeoutage.Options.MassLapse*).
	OutageMassLapseThreshold float64
	OutageMassLapseMinNodes  int
	OutageMassLapseTaint     bool
	// HyperNodes keeps a Volcano HyperNode per NVLink clique once the
	// HyperNode API is served (pkg/controller/hypernodes).
	HyperNodes bool

	// ComputeDomains runs the ComputeDomain reconciler and publishes the
	// IMEX channel pools (pkg/controller/computedomain, imexchannels).
	ComputeDomains bool
	// IMEXChannelsPerClique is the number of channel devices per clique.
	IMEXChannelsPerClique int
	// ComputeDomainPruneGracePeriod: computedomain.Options.PruneGracePeriod.
	ComputeDomainPruneGracePeriod time.Duration

	LeaderElection LeaderElectionConfig

	// KubeClient and RestConfig, when set, replace the clients built from
	// Kubeconfig (tests, and integration tests against a real API server).
	KubeClient kubernetes.Interface
	RestConfig *rest.Config
	// DynamicClient, when set, replaces the dynamic client (ComputeDomains)
	// built from Kubeconfig.
	DynamicClient dynamic.Interface
	// WebhookListener and HTTPListener, when set, are served instead of
	// listening on the addresses (tests use port 0).
	WebhookListener net.Listener
	HTTPListener    net.Listener
	// Metrics, when set, replaces the metrics registered with the global
	// (legacyregistry) registry that /metrics serves.
	Metrics *metrics.Metrics
}

// WebhookConfig configures the admission webhook and its TLS.
type WebhookConfig struct {
	Enabled bool
	Address string
	// CertFile and KeyFile, when set, are served (e.g. a cert-manager
	// Secret mounted into the pod) and TLS is not self-managed.
	CertFile, KeyFile string
	// Self-managed TLS: the Secret holding CA and serving certificate, the
	// Service the API server calls (its DNS names go into the
	// certificate), and the ValidatingWebhookConfiguration that gets the
	// CA bundle ("" leaves the bundle to someone else).
	SecretName        string
	ServiceName       string
	ClusterDomain     string
	ConfigurationName string
	CAValidity        time.Duration
	CertValidity      time.Duration
	// CAPropagationDelay is how long a new CA is in the bundle before
	// serving certificates it signed are used.
	CAPropagationDelay time.Duration
	// RequestTimeout bounds the TLS handshake and reading a request, and
	// writing its response: a client that sends slowly or never finishes
	// loses its connection.
	RequestTimeout time.Duration
	// QuotaResourceNames are the extended resource names the driver's
	// DeviceClasses serve; ResourceQuotas limiting one without the
	// requests. prefix get a warning, as those limiting a device plugin
	// name do (webhook.QuotaNames).
	QuotaResourceNames []string
}

// RequestTranslationConfig configures the request translation
// (pkg/requesttranslation, docs/migration.md "Volcano").
type RequestTranslationConfig struct {
	// Schedulers whose pods and Volcano Jobs are translated; empty: off.
	Schedulers []string
	// GangGuard adds a 1m cpu request to their pods with ResourceClaims and
	// no cpu or memory, so that Volcano does not backfill them one by one.
	GangGuard bool
	// MutatingWebhookConfigurationName gets the CA bundle with
	// self-managed TLS; empty: none.
	MutatingWebhookConfigurationName string
}

// leaderWork reports whether any leader-only controller is on.
func (c *Config) leaderWork() bool {
	return c.NodeLabels || c.ModelDeviceClasses || c.MIGProfileDeviceClasses || c.Outage || c.ComputeDomains || c.HyperNodes
}

// translationEnabled reports whether the request translation is served:
// the webhook serves it.
func (c *Config) translationEnabled() bool {
	return c.Webhook.Enabled && len(c.RequestTranslation.Schedulers) > 0
}

// SelfManagedTLS reports whether the controller manages its own
// certificates.
func (w *WebhookConfig) SelfManagedTLS() bool { return w.CertFile == "" && w.KeyFile == "" }

// LeaderElectionConfig configures the election among replicas for the
// node label and DeviceClass controllers.
type LeaderElectionConfig struct {
	Enabled       bool
	LeaseName     string
	Identity      string
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
}

// AddFlags registers the controller's flags on fs, with their defaults.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.DriverName, "driver-name", vocabulary.DriverName, "DRA driver name: opaque configs with this driver are validated, its ResourceSlices labelled.")
	fs.StringVar(&c.Namespace, "namespace", "", "Namespace of the controller (leader election Lease, self-managed TLS Secret); set it from the downward API (metadata.namespace).")
	c.Options.AddFlags(fs, 20, 50, "API client QPS.")
	fs.StringVar(&c.HTTPAddress, "http-address", ":8080", "Address for /healthz, /readyz and /metrics (plain HTTP).")

	fs.BoolVar(&c.Webhook.Enabled, "webhook", true, "Serve the validating admission webhook (every replica serves it; no leader election needed).")
	fs.StringVar(&c.Webhook.Address, "webhook-address", ":8443", "HTTPS address of the admission webhook (path /validate).")
	fs.StringSliceVar(&c.Webhook.QuotaResourceNames, "quota-resource-names", nil, "Extended resource names the driver's DeviceClasses serve (the chart passes extendedResourceName and extendedResources): a ResourceQuota limiting one without the requests. prefix, which is never enforced, is admitted with a warning, as one limiting nvidia.com/gpu is.")
	fs.DurationVar(&c.Webhook.RequestTimeout, "webhook-request-timeout", 30*time.Second, "Bound on the TLS handshake, reading one webhook request and writing its response (the API server waits at most 30s for a webhook); slower clients are disconnected.")
	fs.StringVar(&c.Webhook.CertFile, "tls-cert-file", "", "Serving certificate (PEM), e.g. from cert-manager; with --tls-key-file it turns self-managed TLS off. Reloaded when it changes.")
	fs.StringVar(&c.Webhook.KeyFile, "tls-key-file", "", "Private key (PEM) of --tls-cert-file.")
	fs.StringVar(&c.Webhook.SecretName, "tls-secret-name", "gpu-dra-controller-webhook-tls", "Self-managed TLS: Secret in --namespace holding the CA and the serving certificate.")
	fs.StringVar(&c.Webhook.ServiceName, "webhook-service-name", "gpu-dra-controller", "Self-managed TLS: Service in --namespace through which the API server calls the webhook; its DNS names go into the certificate.")
	fs.StringVar(&c.Webhook.ClusterDomain, "cluster-domain", "cluster.local", "Self-managed TLS: cluster DNS domain, for the Service's fully qualified name.")
	fs.StringVar(&c.Webhook.ConfigurationName, "webhook-configuration-name", "gpu-dra-driver-webhook", "Self-managed TLS: ValidatingWebhookConfiguration whose webhooks get the CA bundle; empty leaves it alone.")
	fs.DurationVar(&c.Webhook.CAValidity, "ca-validity", certs.DefaultCAValidity, "Self-managed TLS: lifetime of the CA; a new one is made after two thirds of it.")
	fs.DurationVar(&c.Webhook.CertValidity, "cert-validity", certs.DefaultCertValidity, "Self-managed TLS: lifetime of the serving certificate; a new one is made after two thirds of it.")
	fs.DurationVar(&c.Webhook.CAPropagationDelay, "ca-propagation-delay", certs.DefaultPropagationDelay, "Self-managed TLS: how long a new CA is in the webhook configuration's bundle before serving certificates it signed are used, so that every API server trusts them.")

	fs.StringSliceVar(&c.RequestTranslation.Schedulers, "request-translation-schedulers", []string{"volcano"}, "Schedulers (spec.schedulerName) that cannot read DRA extended resources: the webhook (path /mutate) turns their pods' and Volcano Jobs' requests for a name a DeviceClass serves (nvidia.com/gpu) into ResourceClaims (docs/migration.md). Empty: off. Needs --webhook.")
	fs.BoolVar(&c.RequestTranslation.GangGuard, "request-translation-gang-guard", true, "With --request-translation-schedulers: add a 1m cpu request to their pods (and Job task templates) that have ResourceClaims but no cpu or memory, so that Volcano does not take them for best-effort pods and backfill a gang one pod at a time.")
	fs.StringVar(&c.RequestTranslation.MutatingWebhookConfigurationName, "mutating-webhook-configuration-name", "", "Self-managed TLS: MutatingWebhookConfiguration of the request translation whose webhooks get the CA bundle; empty: none.")

	fs.BoolVar(&c.NodeLabels, "node-labels", true, "Label nodes with GPU Feature Discovery's labels, derived from the driver's ResourceSlices (leader only).")
	fs.BoolVar(&c.ModelDeviceClasses, "model-device-classes", false, "Keep one DeviceClass per GPU model in the cluster, e.g. nvidia-h100-80gb-hbm3.<driver-name> (leader only).")
	fs.BoolVar(&c.MIGProfileDeviceClasses, "mig-profile-device-classes", false, "Keep one DeviceClass per MIG profile in the cluster's ResourceSlices, e.g. mig-1g.10gb.<driver-name>, serving the device plugin's extended resource nvidia.com/mig-1g.10gb (leader only; docs/migration.md).")
	fs.DurationVar(&c.ModelDeviceClassGracePeriod, "model-device-class-grace-period", modelclasses.DefaultGracePeriod, "How long a GPU model must be gone from all ResourceSlices before its DeviceClass is deleted.")
	fs.IntVar(&c.Workers, "workers", 4, "Concurrent node label updates.")
	fs.BoolVar(&c.Outage, "outage-taints", true, "Taint the devices of a node whose kubelet plugin stopped renewing its heartbeat Lease (it is registered but does not serve) with a DeviceTaintRule, "+
		"deleted when it serves again (leader only; needs resource.k8s.io/v1 DeviceTaintRules, Kubernetes 1.37+: without them the controller logs that outage taints are unavailable and carries on).")
	fs.DurationVar(&c.OutageGracePeriod, "outage-grace-period", nodeoutage.DefaultGracePeriod, "How long a node's heartbeat Lease may go unrenewed, on the controller's clock, before the node's devices are tainted NoSchedule.")
	fs.DurationVar(&c.OutageNoExecuteAfter, "outage-noexecute-after", 0, "When positive (at least --outage-grace-period): how long a heartbeat Lease may go unrenewed before the taint becomes NoExecute and the pods using the node's devices are evicted. 0: never.")
	fs.Float64Var(&c.OutageMassLapseThreshold, "outage-mass-lapse-threshold", nodeoutage.DefaultMassLapseThreshold, "Share (0 < x <= 1) of the nodes with a heartbeat Lease that, lapsed at once (and at least --outage-mass-lapse-min-nodes of them), "+
		"is a mass lapse: blamed on the API server or the controller rather than the plugins, so no taint becomes NoExecute (existing NoExecute ones go back to NoSchedule) until fewer are lapsed.")
	fs.IntVar(&c.OutageMassLapseMinNodes, "outage-mass-lapse-min-nodes", nodeoutage.DefaultMassLapseMinNodes, "Fewest lapsed nodes that make a mass lapse (at least 1).")
	fs.BoolVar(&c.OutageMassLapseTaint, "outage-mass-lapse-taint", true, "During a mass lapse, still taint newly lapsed nodes NoSchedule; false: taint none until the mass lapse is over.")

	fs.BoolVar(&c.HyperNodes, "volcano-hypernodes", true, "Keep one Volcano HyperNode (topology.volcano.sh/v1alpha1, tier 1) per NVLink clique, its members the nodes labelled "+vocabulary.LabelClique+", so that Volcano places a Job with networkTopology mode hard, highestTierAllowed 1 inside one clique (leader only; does nothing until Volcano's HyperNode CRD is served).")

	fs.BoolVar(&c.ComputeDomains, "compute-domains", true, "Reconcile ComputeDomains (create each domain's channel ResourceClaim, its Ready condition, AfterLastPod deletion) and publish the IMEX channels of each NVLink clique that --node-labels labels (leader only; needs the ComputeDomain CRD).")
	fs.IntVar(&c.IMEXChannelsPerClique, "imex-channels-per-clique", imexchannels.DefaultChannels, "IMEX channel devices published per NVLink clique (1..128): how many ComputeDomains can run in the cluster at once (each holds a channel number of its own).")
	fs.DurationVar(&c.ComputeDomainPruneGracePeriod, "compute-domain-prune-grace-period", computedomain.DefaultPruneGracePeriod, "How long a ComputeDomain's node entry may stand without a pod of the domain on its node before the controller removes it (a dead node cannot remove its own).")
	fs.BoolVar(&c.LeaderElection.Enabled, "leader-elect", true, "Elect a leader (Lease in --namespace) to run the node label and DeviceClass controllers; turn off only with a single replica.")
	fs.StringVar(&c.LeaderElection.LeaseName, "leader-elect-lease-name", "gpu-dra-controller", "Name of the leader election Lease.")
	fs.StringVar(&c.LeaderElection.Identity, "leader-elect-identity", "", "Identity in the Lease; default: host name plus a random suffix.")
	fs.DurationVar(&c.LeaderElection.LeaseDuration, "leader-elect-lease-duration", 15*time.Second, "How long a lease lasts without renewal before others may take it.")
	fs.DurationVar(&c.LeaderElection.RenewDeadline, "leader-elect-renew-deadline", 10*time.Second, "How long the leader tries to renew before it gives up leadership (and exits).")
	fs.DurationVar(&c.LeaderElection.RetryPeriod, "leader-elect-retry-period", 2*time.Second, "How often candidates try to acquire or renew the lease.")
}

// Validate reports configuration errors before anything starts.
func (c *Config) Validate() error {
	var errs []error
	if c.DriverName == "" {
		errs = append(errs, errors.New("--driver-name must not be empty"))
	}
	leaderWork := c.leaderWork()
	if !c.Webhook.Enabled && !leaderWork {
		errs = append(errs, errors.New("nothing to do: --webhook, --node-labels, --model-device-classes, --mig-profile-device-classes, --outage-taints, --compute-domains and --volcano-hypernodes are all off"))
	}
	if c.ComputeDomains {
		if err := imexchannels.ValidateChannels("--imex-channels-per-clique", c.IMEXChannelsPerClique); err != nil {
			errs = append(errs, err)
		}
		if c.ComputeDomainPruneGracePeriod <= 0 {
			errs = append(errs, fmt.Errorf("--compute-domain-prune-grace-period (%v) must be positive", c.ComputeDomainPruneGracePeriod))
		}
	}
	if c.Outage {
		if c.Namespace == "" {
			errs = append(errs, errors.New("--namespace is required for --outage-taints: the plugins' heartbeat Leases live there"))
		}
		if c.OutageGracePeriod <= 0 {
			errs = append(errs, fmt.Errorf("--outage-grace-period (%v) must be positive", c.OutageGracePeriod))
		}
		if c.OutageNoExecuteAfter < 0 || c.OutageNoExecuteAfter > 0 && c.OutageNoExecuteAfter < c.OutageGracePeriod {
			errs = append(errs, fmt.Errorf("--outage-noexecute-after (%v) must be 0 or at least --outage-grace-period (%v)", c.OutageNoExecuteAfter, c.OutageGracePeriod))
		}
		if !(c.OutageMassLapseThreshold > 0 && c.OutageMassLapseThreshold <= 1) {
			errs = append(errs, fmt.Errorf("--outage-mass-lapse-threshold (%v) must be a share in (0, 1]", c.OutageMassLapseThreshold))
		}
		if c.OutageMassLapseMinNodes < 1 {
			errs = append(errs, fmt.Errorf("--outage-mass-lapse-min-nodes (%d) must be at least 1", c.OutageMassLapseMinNodes))
		}
	}
	for _, s := range c.RequestTranslation.Schedulers {
		if msgs := validation.IsDNS1123Subdomain(s); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--request-translation-schedulers: %q is not a scheduler name: %s", s, strings.Join(msgs, "; ")))
		}
	}
	if c.Webhook.Enabled {
		w := &c.Webhook
		if w.RequestTimeout <= 0 {
			errs = append(errs, fmt.Errorf("--webhook-request-timeout (%v) must be positive", w.RequestTimeout))
		}
		for _, name := range w.QuotaResourceNames {
			if msgs := validation.IsQualifiedName(name); len(msgs) > 0 || !strings.Contains(name, "/") {
				errs = append(errs, fmt.Errorf("--quota-resource-names: %q is not an extended resource name (domain/name): %s", name, strings.Join(msgs, "; ")))
			}
		}
		if (w.CertFile == "") != (w.KeyFile == "") {
			errs = append(errs, errors.New("--tls-cert-file and --tls-key-file go together"))
		}
		if w.SelfManagedTLS() {
			if c.Namespace == "" {
				errs = append(errs, errors.New("--namespace is required for self-managed TLS (or give --tls-cert-file and --tls-key-file)"))
			}
			if w.SecretName == "" || w.ServiceName == "" {
				errs = append(errs, errors.New("--tls-secret-name and --webhook-service-name are required for self-managed TLS"))
			}
			if w.CAValidity <= 0 || w.CertValidity <= 0 || w.CertValidity > w.CAValidity {
				errs = append(errs, fmt.Errorf("--cert-validity (%v) must be positive and at most --ca-validity (%v)", w.CertValidity, w.CAValidity))
			}
			if w.CAPropagationDelay <= 0 {
				errs = append(errs, fmt.Errorf("--ca-propagation-delay (%v) must be positive", w.CAPropagationDelay))
			}
		}
	}
	if leaderWork && c.LeaderElection.Enabled {
		l := &c.LeaderElection
		if c.Namespace == "" {
			errs = append(errs, errors.New("--namespace is required for leader election"))
		}
		if l.LeaseName == "" {
			errs = append(errs, errors.New("--leader-elect-lease-name must not be empty"))
		}
		if !(l.LeaseDuration > l.RenewDeadline && l.RenewDeadline > l.RetryPeriod && l.RetryPeriod > 0) {
			errs = append(errs, fmt.Errorf("leader election needs lease duration (%v) > renew deadline (%v) > retry period (%v) > 0",
				l.LeaseDuration, l.RenewDeadline, l.RetryPeriod))
		}
	}
	if c.ModelDeviceClassGracePeriod < 0 {
		errs = append(errs, errors.New("--model-device-class-grace-period must not be negative"))
	}
	return errors.Join(errs...)
}
