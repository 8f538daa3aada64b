// Package kueue runs Kueue (sigs.k8s.io/kueue, built by hack/kueue/build.sh from
// its Go module) beside the local cluster's control plane, and holds the team
// batch-queue scenario the demo and the e2e suite show with it: a ClusterQueue
// whose quota covers whole GPUs, MIG devices by the counters they consume and
// MPS shares, jobs waiting in the queue and admitted as capacity frees, and an
// in-tree gang (Workload/PodGroup) starting all-or-nothing.
//
// The manager is a host process with the admin kubeconfig, like the API server
// and the scheduler: its webhooks listen on 127.0.0.1 with a certificate made
// here, and the webhook configurations call that URL (Kueue's
// internalCertManagement, which patches configurations pointing at a Service,
// is off). The local cluster has no Service proxy, so a pod's webhook would be
// unreachable from the API server.
package kueue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	certutil "k8s.io/client-go/util/cert"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
)

// Namespace is Kueue's own namespace (its configuration's namespace).
const Namespace = "kueue-system"

// metricsCertDir is where Kueue v0.17.0 reads its metrics server's
// certificate when internalCertManagement is off: cmd/kueue/main.go
// hard-codes it and exits when the files are missing, even with metrics off.
const metricsCertDir = "/etc/kueue/metrics/certs"

// Options say where Kueue is and how to run it.
type Options struct {
	// Dir is hack/kueue/build.sh's cache directory: bin/kueue and config/
	// (crds/*.yaml, webhooks.yaml) from the Kueue module.
	Dir string
	// WorkDir holds the configuration, certificate and log of this run.
	WorkDir string
	// PIDFile, if set, gets the manager's PID, so hack/cluster/down.sh stops a
	// manager whose starter died.
	PIDFile string
	// WebhookPort and HealthPort are the manager's ports on 127.0.0.1.
	WebhookPort, HealthPort int
	// Transformations and MPSClass are its resources configuration: MIG
	// profiles charged by their counters, claims of MPSClass counted as
	// ResourceMPSShares.
	Transformations []Transformation
	MPSClass        string
	// Timeout bounds each wait (CRDs established, manager ready, webhooks live).
	Timeout time.Duration
}

// Manager is a running Kueue manager.
type Manager struct {
	c        *scenarios.Cluster
	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
	webhooks []*unstructured.Unstructured
	Log      string
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Start installs Kueue's CRDs, starts the manager and registers its webhooks,
// returning once a queued Job is suspended by the webhook.
func Start(ctx context.Context, c *scenarios.Cluster, o Options) (*Manager, error) {
	bin := filepath.Join(o.Dir, "bin", "kueue")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("kueue manager: %w (hack/kueue/build.sh builds it)", err)
	}
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return nil, err
	}
	if err := applyCRDs(ctx, c, filepath.Join(o.Dir, "config", "crds"), o.Timeout); err != nil {
		return nil, err
	}
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": Namespace}}}
	if err := c.Apply(ctx, ns); err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		return nil, fmt.Errorf("webhook certificate: %w", err)
	}
	certDir := filepath.Join(o.WorkDir, "certs")
	for _, dir := range []string{certDir, metricsCertDir} {
		if err := writeKeyPair(dir, certPEM, keyPEM); err != nil {
			return nil, err
		}
	}
	cfgFile := filepath.Join(o.WorkDir, "config.json")
	cfg, err := configuration(o, certDir)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(cfgFile, cfg, 0o644); err != nil {
		return nil, err
	}
	manifests, err := os.ReadFile(filepath.Join(o.Dir, "config", "webhooks.yaml"))
	if err != nil {
		return nil, err
	}
	hooks, err := Webhooks(manifests, "https://127.0.0.1:"+strconv.Itoa(o.WebhookPort), certPEM, "gdd-kueue")
	if err != nil {
		return nil, err
	}

	m := &Manager{c: c, exited: make(chan struct{}), webhooks: hooks, Log: filepath.Join(o.WorkDir, "kueue.log")}
	logFile, err := os.Create(m.Log)
	if err != nil {
		return nil, err
	}
	m.cmd = exec.Command(bin, "--config="+cfgFile, "--kubeconfig="+c.Kubeconfig)
	m.cmd.Stdout, m.cmd.Stderr = logFile, logFile
	if err := m.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() { m.waitErr = m.cmd.Wait(); logFile.Close(); close(m.exited) }()
	if o.PIDFile != "" {
		if err := os.WriteFile(o.PIDFile, []byte(strconv.Itoa(m.cmd.Process.Pid)+"\n"), 0o644); err != nil {
			return m, errors.Join(err, m.Stop(ctx))
		}
	}
	if err := m.waitReady(ctx, o.HealthPort, o.Timeout); err != nil {
		return m, errors.Join(err, m.Stop(ctx))
	}
	for _, h := range hooks {
		if err := c.Apply(ctx, h); err != nil {
			return m, errors.Join(err, m.Stop(ctx))
		}
	}
	if err := waitWebhooks(ctx, c, o.Timeout); err != nil {
		return m, errors.Join(fmt.Errorf("%w (log %s)", err, m.Log), m.Stop(ctx))
	}
	return m, nil
}

// writeKeyPair writes tls.crt and tls.key, controller-runtime's names.
func writeKeyPair(dir string, certPEM, keyPEM []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "tls.key"), keyPEM, 0o600)
}

// configuration renders Kueue's Configuration (config.kueue.x-k8s.io/v1beta2).
func configuration(o Options, certDir string) ([]byte, error) {
	if o.MPSClass == "" {
		return nil, errors.New("kueue configuration: no MPS device class")
	}
	cfg := map[string]any{
		"apiVersion": "config.kueue.x-k8s.io/v1beta2",
		"kind":       "Configuration",
		"namespace":  Namespace,
		"health":     map[string]any{"healthProbeBindAddress": "127.0.0.1:" + strconv.Itoa(o.HealthPort)},
		// The metrics server would need the delegated authorization of an
		// in-cluster pod; this run does not need it.
		"metrics":                    map[string]any{"bindAddress": "0"},
		"webhook":                    map[string]any{"host": "127.0.0.1", "port": o.WebhookPort, "certDir": certDir},
		"leaderElection":             map[string]any{"leaderElect": false},
		"internalCertManagement":     map[string]any{"enable": false},
		"manageJobsWithoutQueueName": false,
		"integrations":               map[string]any{"frameworks": []string{"batch/job"}},
		"featureGates": map[string]bool{
			// Counts a claim template's devices per DeviceClass
			// (resources.deviceClassMappings), for the MPS shares.
			"DynamicResourceAllocation": true,
			// The visibility API is an aggregated API server, which needs
			// an APIService and a Service this run does not make.
			"VisibilityOnDemand": false,
		},
		"resources": map[string]any{
			"transformations": o.Transformations,
			"deviceClassMappings": []any{map[string]any{
				"name": ResourceMPSShares, "deviceClassNames": []string{o.MPSClass},
			}},
		},
	}
	return json.MarshalIndent(cfg, "", "  ")
}

func applyCRDs(ctx context.Context, c *scenarios.Cluster, dir string, timeout time.Duration) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no Kueue CRDs in %s (hack/kueue/build.sh copies them): %v", dir, err)
	}
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		objs, err := scenarios.DecodeObjects(data)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		for _, o := range objs {
			if err := c.Apply(ctx, o); err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			names = append(names, o.GetName())
		}
	}
	return wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		for _, n := range names {
			crd, err := c.Dynamic.Resource(crdGVR).Get(ctx, n, metav1GetOptions)
			if err != nil {
				return false, nil
			}
			if !conditionTrue(crd, "Established") {
				return false, nil
			}
		}
		c.Mapper.Reset()
		return true, nil
	})
}

func (m *Manager) waitReady(ctx context.Context, port int, timeout time.Duration) error {
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/readyz"
	client := &http.Client{Timeout: 5 * time.Second}
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-m.exited:
			return false, fmt.Errorf("kueue manager exited: %v", m.waitErr)
		default:
		}
		resp, err := client.Get(url)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("kueue manager not ready at %s: %w (log %s: %s)", url, err, m.Log, tail(m.Log, 2000))
	}
	return nil
}

// waitWebhooks waits until the API server calls the Job webhook: a dry-run Job
// with QueueNameLabel comes back suspended.
func waitWebhooks(ctx context.Context, c *scenarios.Cluster, timeout time.Duration) error {
	job := job("default", "gdd-kueue-webhook-probe", "none", 1, 1, extendedResourcePod("probe", "cpu", 1))
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		got, err := c.Client.BatchV1().Jobs("default").Create(ctx, job, dryRunCreate)
		if err != nil {
			last = err
			return false, nil
		}
		return got.Spec.Suspend != nil && *got.Spec.Suspend, nil
	})
	if err != nil {
		return fmt.Errorf("Kueue's Job webhook does not suspend a queued Job: %w (last error: %v)", err, last)
	}
	return nil
}

// Stop removes the webhook configurations and stops the manager (SIGTERM, then
// SIGKILL after 30 s).
func (m *Manager) Stop(ctx context.Context) error {
	var errs []error
	for _, h := range m.webhooks {
		gvr := schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: map[string]string{
			"MutatingWebhookConfiguration": "mutatingwebhookconfigurations", "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
		}[h.GetKind()]}
		if err := m.c.Dynamic.Resource(gvr).Delete(ctx, h.GetName(), metav1DeleteOptions); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s %s: %w", h.GetKind(), h.GetName(), err))
		}
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(30 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Remove(filepath.Join(metricsCertDir, f)); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// tail returns the last n bytes of a file, for error messages.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(data) > n {
		data = data[len(data)-n:]
	}
	return string(bytes.TrimSpace(data))
}
