package controller

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"                // client-go request metrics
	_ "k8s.io/component-base/metrics/prometheus/clientgo/leaderelection" // leader_election_master_status
	_ "k8s.io/component-base/metrics/prometheus/workqueue"               // workqueue metrics
	"k8s.io/dynamic-resource-allocation/deviceclass/extendedresourcecache"
	"k8s.io/klog/v2"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/certs"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/computedomain"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/imexchannels"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/modelclasses"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/nodelabels"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/nodeoutage"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/webhook"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// userAgent identifies the controller's API requests; the API server
// records it as the field manager of what the controller writes.
const userAgent = vocabulary.ControllerAgent

// webhookMaxHeaderBytes bounds a webhook request's headers; the API server
// sends a few hundred bytes.
const webhookMaxHeaderBytes = 64 << 10

// shutdownTimeout bounds draining the servers on exit.
const shutdownTimeout = 10 * time.Second

// globalMetrics are registered once with legacyregistry, which /metrics
// serves together with the process, Go, client-go, workqueue and leader
// election metrics.
var globalMetrics = sync.OnceValue(func() *metrics.Metrics {
	m := metrics.New()
	m.MustRegister(legacyRegisterer{})
	return m
})

type legacyRegisterer struct{}

func (legacyRegisterer) MustRegister(cs ...k8smetrics.Registerable) {
	legacyregistry.MustRegister(cs...)
}

// Run runs the controller until ctx is done or a component fails. Losing
// leadership is a failure: the process exits (and restarts) rather than
// risk two leaders.
func Run(ctx context.Context, cfg *Config) error {
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	logger := klog.FromContext(ctx)

	client, err := clients(cfg)
	if err != nil {
		return err
	}
	m := cfg.Metrics
	if m == nil {
		m = globalMetrics()
	}

	// The components: the first to fail stops the others (its error is
	// the group context's cause). Every return, early ones too, stops
	// them, drains the servers and waits for them.
	group, ctx := errgroup.WithContext(ctx)
	var servers []*http.Server
	defer func() {
		cancel(nil)
		shutdownCtx, done := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		defer done()
		for _, srv := range servers {
			_ = srv.Shutdown(shutdownCtx)
		}
		_ = group.Wait()
	}()
	goRun := func(name string, fn func(context.Context) error) {
		group.Go(func() error {
			if err := fn(ctx); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		})
	}

	// Health checks, served as kube-apiserver serves its own.
	liveChecks := []healthz.HealthChecker{healthz.PingHealthz}
	var readyChecks []healthz.HealthChecker

	// The webhook: every replica serves it, from the start.
	if cfg.Webhook.Enabled {
		source, err := certSource(client, cfg, m)
		if err != nil {
			return err
		}
		goRun("webhook certificates", source.Run)
		mux := http.NewServeMux()
		mux.Handle(webhook.Path, webhook.NewHandler(cfg.DriverName, m, cfg.Webhook.QuotaResourceNames...))
		if cfg.translationEnabled() {
			mutator, synced := requestTranslation(ctx, client, cfg, m, goRun)
			mux.Handle(webhook.MutatePath, mutator)
			readyChecks = append(readyChecks, healthz.NamedCheck("request-translation-deviceclasses", func(*http.Request) error {
				if !synced() {
					return errors.New("DeviceClasses not synced yet")
				}
				return nil
			}))
		} else if len(cfg.RequestTranslation.Schedulers) > 0 {
			logger.Info("Request translation off: it is served by the webhook, which is off", "schedulers", cfg.RequestTranslation.Schedulers)
		}
		mux.Handle(webhookProbePath, webhookProbeHandler)
		srv := &http.Server{
			Handler:   withLogger(mux, logger.WithName("webhook")),
			TLSConfig: &tls.Config{GetCertificate: source.GetCertificate, MinVersion: tls.VersionTLS12},
			// Every phase is bounded, so that slow or stalled clients
			// cannot hold connections and goroutines (the handshake
			// gets the shortest of these).
			ReadHeaderTimeout: min(10*time.Second, cfg.Webhook.RequestTimeout),
			ReadTimeout:       cfg.Webhook.RequestTimeout,
			WriteTimeout:      cfg.Webhook.RequestTimeout,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    webhookMaxHeaderBytes,
		}
		ln, err := listen(cfg.WebhookListener, cfg.Webhook.Address)
		if err != nil {
			return fmt.Errorf("webhook: %w", err)
		}
		var serving atomic.Bool
		readyChecks = append(readyChecks,
			healthz.NamedCheck("webhook-certificate", func(*http.Request) error { return source.Ready() }),
			healthz.NamedCheck("webhook-server", func(*http.Request) error {
				if !serving.Load() {
					return errors.New("not serving")
				}
				return nil
			}),
			webhookServingCheck(ln.Addr()))
		servers = append(servers, srv)
		logger.Info("Serving admission webhook", "address", ln.Addr().String(), "path", webhook.Path,
			"selfManagedTLS", cfg.Webhook.SelfManagedTLS(), "requestTranslationSchedulers", cfg.RequestTranslation.Schedulers)
		goRun("webhook server", func(context.Context) error {
			serving.Store(true)
			defer serving.Store(false)
			if err := srv.ServeTLS(ln, "", ""); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}

	// Leader-only controllers.
	if cfg.leaderWork() {
		if cfg.LeaderElection.Enabled {
			le, adaptor, err := leaderElector(client, cfg, func(ctx context.Context) {
				if err := runControllers(ctx, client, cfg, m); err != nil {
					cancel(err)
				}
			}, func() {
				if parent.Err() == nil {
					cancel(errors.New("lost leader election lease; exiting so that a new leader takes over"))
				}
			})
			if err != nil {
				return err
			}
			liveChecks = append(liveChecks, healthz.NamedCheck("leader-election", adaptor.Check))
			goRun("leader election", func(ctx context.Context) error { le.Run(ctx); return nil })
		} else {
			goRun("controllers", func(ctx context.Context) error { return runControllers(ctx, client, cfg, m) })
		}
	}

	// Health and metrics.
	if cfg.HTTPAddress != "" || cfg.HTTPListener != nil {
		mux := http.NewServeMux()
		healthz.InstallHandler(mux, liveChecks...)
		healthz.InstallLivezHandler(mux, liveChecks...)
		healthz.InstallReadyzHandler(mux, readyChecks...)
		mux.Handle("/metrics", legacyregistry.Handler())
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		ln, err := listen(cfg.HTTPListener, cfg.HTTPAddress)
		if err != nil {
			return fmt.Errorf("health and metrics: %w", err)
		}
		servers = append(servers, srv)
		logger.Info("Serving health checks and metrics", "address", ln.Addr().String())
		goRun("health and metrics server", func(context.Context) error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}

	<-ctx.Done()
	cause := context.Cause(ctx)
	if parent.Err() == nil {
		logger.Error(cause, "Stopping")
	} else {
		logger.Info("Stopping", "cause", cause)
	}
	if parent.Err() != nil {
		return nil
	}
	return cause
}

// requestTranslation returns the mutating handler of the request
// translation and whether its DeviceClass informer has synced; goRun runs
// the informer. Every replica serves it, so every replica watches all
// DeviceClasses (few, small objects).
func requestTranslation(ctx context.Context, client kubernetes.Interface, cfg *Config, m *metrics.Metrics, goRun func(string, func(context.Context) error)) (http.Handler, func() bool) {
	classes := extendedresourcecache.NewExtendedResourceCache(klog.FromContext(ctx).WithName("request-translation"))
	factory := informers.NewSharedInformerFactory(client, 0)
	// Synced once the cache has seen every DeviceClass of the initial list
	// (the registration's, not the informer's, HasSynced). It cannot fail
	// on an informer that has not started.
	registration, _ := factory.Resource().V1().DeviceClasses().Informer().AddEventHandler(classes)
	goRun("request translation DeviceClass informer", func(ctx context.Context) error {
		factory.Start(ctx.Done())
		<-ctx.Done()
		factory.Shutdown()
		return nil
	})
	return webhook.NewMutator(cfg.DriverName, webhook.TranslationConfig{
		Schedulers: cfg.RequestTranslation.Schedulers, GangGuard: cfg.RequestTranslation.GangGuard, Classes: classes, Client: client,
	}, m), registration.HasSynced
}

func clients(cfg *Config) (kubernetes.Interface, error) {
	if cfg.KubeClient != nil {
		return cfg.KubeClient, nil
	}
	return cfg.Options.New(cfg.RestConfig, userAgent)
}

func certSource(client kubernetes.Interface, cfg *Config, m *metrics.Metrics) (certs.Source, error) {
	w := &cfg.Webhook
	if !w.SelfManagedTLS() {
		return certs.NewFileSource(w.CertFile, w.KeyFile, 0, m), nil
	}
	return certs.NewManager(client, certs.Config{
		Namespace:         cfg.Namespace,
		SecretName:        w.SecretName,
		WebhookConfigName: w.ConfigurationName,
		// Only when the translation is served: the chart renders that
		// configuration only then.
		MutatingWebhookConfigName: mutatingConfigName(cfg),
		DNSNames:                  certs.ServiceDNSNames(w.ServiceName, cfg.Namespace, w.ClusterDomain),
		CAValidity:                w.CAValidity,
		CertValidity:              w.CertValidity,
		PropagationDelay:          w.CAPropagationDelay,
		Metrics:                   m,
	})
}

func mutatingConfigName(cfg *Config) string {
	if !cfg.translationEnabled() {
		return ""
	}
	return cfg.RequestTranslation.MutatingWebhookConfigurationName
}

func listen(ln net.Listener, address string) (net.Listener, error) {
	if ln != nil {
		return ln, nil
	}
	return net.Listen("tcp", address)
}

// withLogger puts logger into each request's context.
func withLogger(h http.Handler, logger klog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(klog.NewContext(r.Context(), logger)))
	})
}

func leaderElector(client kubernetes.Interface, cfg *Config, lead func(context.Context), stopped func()) (*leaderelection.LeaderElector, *leaderelection.HealthzAdaptor, error) {
	l := cfg.LeaderElection
	id := l.Identity
	if id == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, nil, fmt.Errorf("leader election identity: %w", err)
		}
		id = host + "_" + string(uuid.NewUUID())
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, cfg.Namespace, l.LeaseName,
		client.CoreV1(), client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return nil, nil, fmt.Errorf("leader election lock: %w", err)
	}
	// A leader whose renewals are overdue by more than this fails /healthz.
	adaptor := leaderelection.NewLeaderHealthzAdaptor(l.LeaseDuration)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   l.LeaseDuration,
		RenewDeadline:   l.RenewDeadline,
		RetryPeriod:     l.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            l.LeaseName,
		WatchDog:        adaptor,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: lead,
			OnStoppedLeading: stopped,
			OnNewLeader: func(identity string) {
				klog.Background().WithName("leader-election").Info("New leader", "identity", identity, "self", identity == id)
			},
		},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("leader election: %w", err)
	}
	return le, adaptor, nil
}

// runControllers runs the leader-only controllers with their own informers
// (started only on the leader) until ctx is done. They share one informer
// of the driver's ResourceSlices, the largest objects they read.
func runControllers(ctx context.Context, client kubernetes.Interface, cfg *Config, m *metrics.Metrics) error {
	logger := klog.FromContext(ctx)
	// The first controller to fail stops the others and the informers.
	group, ctx := errgroup.WithContext(ctx)
	sliceFactory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, cfg.DriverName).String()
		}))
	slices := sliceFactory.Resource().V1().ResourceSlices()
	var run []func(context.Context) error
	var factories []informers.SharedInformerFactory

	// Node metadata (labels): the node label and IMEX channel controllers.
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(nodelabels.StripNode))
	if cfg.NodeLabels || cfg.ComputeDomains {
		factories = append(factories, nodeFactory)
	}
	if cfg.NodeLabels {
		c, err := nodelabels.New(client, slices, nodeFactory.Core().V1().Nodes(), nodelabels.Options{DriverName: cfg.DriverName, Metrics: m})
		if err != nil {
			return err
		}
		run = append(run, func(ctx context.Context) error { return c.Run(ctx, cfg.Workers) })
	}
	if cfg.ComputeDomains {
		fns, fs, err := computeDomains(client, nodeFactory, cfg)
		if err != nil {
			return err
		}
		run = append(run, fns...)
		factories = append(factories, fs...)
	}
	if cfg.ModelDeviceClasses || cfg.MIGProfileDeviceClasses {
		classFactory := informers.NewSharedInformerFactoryWithOptions(client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.LabelSelector = modelclasses.ModelClassLabel(cfg.DriverName) + "=true"
			}))
		c, err := modelclasses.New(client, slices, classFactory.Resource().V1().DeviceClasses(), modelclasses.Options{
			DriverName: cfg.DriverName, Models: cfg.ModelDeviceClasses, MIGProfiles: cfg.MIGProfileDeviceClasses,
			GracePeriod: cfg.ModelDeviceClassGracePeriod, Metrics: m,
		})
		if err != nil {
			return err
		}
		factories = append(factories, classFactory)
		run = append(run, c.Run)
	}
	if cfg.Outage {
		c, err := nodeoutage.New(client, slices, nodeoutage.Options{
			DriverName: cfg.DriverName, Namespace: cfg.Namespace, Metrics: m,
			GracePeriod: cfg.OutageGracePeriod, NoExecuteAfter: cfg.OutageNoExecuteAfter,
			MassLapseThreshold: cfg.OutageMassLapseThreshold, MassLapseMinNodes: cfg.OutageMassLapseMinNodes, MassLapseTaint: cfg.OutageMassLapseTaint,
		})
		if err != nil {
			return err
		}
		run = append(run, func(ctx context.Context) error { return c.Run(ctx, cfg.Workers) })
	}
	if cfg.HyperNodes {
		fn, factory, err := hyperNodes(client, cfg)
		if err != nil {
			return err
		}
		factories = append(factories, factory)
		run = append(run, fn)
	}
	factories = append(factories, sliceFactory)
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	logger.Info("Leading: running controllers", "computeDomains", cfg.ComputeDomains, "nodeLabels", cfg.NodeLabels, "modelDeviceClasses", cfg.ModelDeviceClasses, "migProfileDeviceClasses", cfg.MIGProfileDeviceClasses, "outageTaints", cfg.Outage, "volcanoHyperNodes", cfg.HyperNodes)

	for _, fn := range run {
		group.Go(func() error { return fn(ctx) })
	}
	err := group.Wait()
	for _, f := range factories {
		f.Shutdown()
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// computeDomains builds the ComputeDomain reconciler and the IMEX channel
// publisher: their run functions (the first also runs the domains' dynamic
// informer) and the typed informer factories to start.
func computeDomains(client kubernetes.Interface, nodeFactory informers.SharedInformerFactory, cfg *Config) ([]func(context.Context) error, []informers.SharedInformerFactory, error) {
	dyn, err := dynamicClient(cfg)
	if err != nil {
		return nil, nil, err
	}
	channels, err := imexchannels.New(client, nodeFactory.Core().V1().Nodes(), imexchannels.Options{
		DriverName: cfg.DriverName, Channels: cfg.IMEXChannelsPerClique,
	})
	if err != nil {
		return nil, nil, err
	}
	claimFactory := informers.NewSharedInformerFactory(client, 0)
	domainFactory := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	domains, err := computedomain.New(client, dyn, domainFactory.ForResource(gpuv1beta1.ComputeDomainResource),
		claimFactory.Resource().V1().ResourceClaims(), computedomain.Options{DriverName: cfg.DriverName, Channels: cfg.IMEXChannelsPerClique, PruneGracePeriod: cfg.ComputeDomainPruneGracePeriod})
	if err != nil {
		return nil, nil, err
	}
	run := []func(context.Context) error{
		channels.Run,
		func(ctx context.Context) error {
			if !computedomain.WaitForCRD(ctx, client.Discovery(), computedomain.DefaultDiscoveryInterval) {
				return nil
			}
			domainFactory.Start(ctx.Done())
			defer domainFactory.Shutdown()
			return domains.Run(ctx, cfg.Workers)
		},
	}
	return run, []informers.SharedInformerFactory{claimFactory}, nil
}
