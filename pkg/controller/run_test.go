package controller

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/certs"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/hypernodes"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/nodelabels"
)

func TestMain(m *testing.M) { os.Exit(simnode.Main(m)) }

// defaults is a Config with the flag defaults.
func defaults(t *testing.T, args ...string) *Config {
	t.Helper()
	var cfg Config
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	// The dynamic client (ComputeDomains, HyperNodes); the typed one is the test's.
	cfg.DynamicClient = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{
			gpuv1beta1.ComputeDomainResource: "ComputeDomainList",
			hypernodes.Resource:              hypernodes.Kind + "List",
		})
	return &cfg
}

func TestValidate(t *testing.T) {
	tests := map[string]struct {
		args    []string
		wantErr string
	}{
		"defaults need a namespace":          {wantErr: "--namespace is required"},
		"defaults with namespace":            {args: []string{"--namespace=gpu"}},
		"cert-manager files":                 {args: []string{"--tls-cert-file=c", "--tls-key-file=k", "--leader-elect=false", "--outage-taints=false"}},
		"cert without key":                   {args: []string{"--namespace=gpu", "--tls-cert-file=c"}, wantErr: "go together"},
		"nothing to do":                      {args: []string{"--webhook=false", "--node-labels=false", "--outage-taints=false", "--compute-domains=false", "--volcano-hypernodes=false"}, wantErr: "nothing to do"},
		"HyperNodes only":                    {args: []string{"--webhook=false", "--node-labels=false", "--outage-taints=false", "--compute-domains=false", "--leader-elect=false"}},
		"no IMEX channels":                   {args: []string{"--namespace=gpu", "--imex-channels-per-clique=0"}, wantErr: "--imex-channels-per-clique (0) must be between 1 and 128"},
		"too many IMEX channels":             {args: []string{"--namespace=gpu", "--imex-channels-per-clique=129"}, wantErr: "--imex-channels-per-clique (129)"},
		"IMEX channels off with domains off": {args: []string{"--namespace=gpu", "--compute-domains=false", "--imex-channels-per-clique=0"}},
		"webhook only, files":                {args: []string{"--node-labels=false", "--outage-taints=false", "--compute-domains=false", "--volcano-hypernodes=false", "--tls-cert-file=c", "--tls-key-file=k"}},
		"bad lease timing":                   {args: []string{"--namespace=gpu", "--leader-elect-renew-deadline=20s"}, wantErr: "lease duration"},
		"cert outlives CA":                   {args: []string{"--namespace=gpu", "--cert-validity=30000h"}, wantErr: "--cert-validity"},
		"no propagation delay":               {args: []string{"--namespace=gpu", "--ca-propagation-delay=0s"}, wantErr: "--ca-propagation-delay"},
		"empty driver":                       {args: []string{"--namespace=gpu", "--driver-name="}, wantErr: "--driver-name"},
		"negative grace":                     {args: []string{"--namespace=gpu", "--model-device-class-grace-period=-1s"}, wantErr: "grace"},
		"labels without leader choice":       {args: []string{"--webhook=false", "--leader-elect=false", "--outage-taints=false"}},
		"outage taints need a namespace":     {args: []string{"--leader-elect=false", "--tls-cert-file=c", "--tls-key-file=k"}, wantErr: "--namespace is required for --outage-taints"},
		"outage grace zero":                  {args: []string{"--namespace=gpu", "--outage-grace-period=0s"}, wantErr: "--outage-grace-period"},
		"noexecute before noschedule":        {args: []string{"--namespace=gpu", "--outage-noexecute-after=10s"}, wantErr: "--outage-noexecute-after (10s) must be 0 or at least --outage-grace-period (40s)"},
		"mass lapse threshold zero":          {args: []string{"--namespace=gpu", "--outage-mass-lapse-threshold=0"}, wantErr: "--outage-mass-lapse-threshold (0) must be a share in (0, 1]"},
		"mass lapse threshold over one":      {args: []string{"--namespace=gpu", "--outage-mass-lapse-threshold=1.5"}, wantErr: "--outage-mass-lapse-threshold (1.5)"},
		"mass lapse no nodes":                {args: []string{"--namespace=gpu", "--outage-mass-lapse-min-nodes=0"}, wantErr: "--outage-mass-lapse-min-nodes (0) must be at least 1"},
		"mass lapse whole cluster":           {args: []string{"--namespace=gpu", "--outage-mass-lapse-threshold=1", "--outage-mass-lapse-min-nodes=1", "--outage-mass-lapse-taint=false"}},
		"noexecute later":                    {args: []string{"--namespace=gpu", "--outage-noexecute-after=10m"}},
		"only MIG profile classes":           {args: []string{"--namespace=gpu", "--webhook=false", "--node-labels=false", "--outage-taints=false", "--mig-profile-device-classes"}},
		"quota resource names":               {args: []string{"--namespace=gpu", "--quota-resource-names=example.com/gpu,nvidia.com/gpu"}},
		"quota resource name without domain": {args: []string{"--namespace=gpu", "--quota-resource-names=example.com/gpu,gpu"}, wantErr: `--quota-resource-names: "gpu" is not an extended resource name`},
		"quota resource name invalid":        {args: []string{"--namespace=gpu", "--quota-resource-names=example.com/gpu'"}, wantErr: "--quota-resource-names"},
		"translation for two schedulers":     {args: []string{"--namespace=gpu", "--request-translation-schedulers=volcano,kai-scheduler"}},
		"translation off":                    {args: []string{"--namespace=gpu", "--request-translation-schedulers="}},
		"bad scheduler name":                 {args: []string{"--namespace=gpu", "--request-translation-schedulers=volcano,Bad'name"}, wantErr: `--request-translation-schedulers: "Bad'name" is not a scheduler name`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := defaults(t, tc.args...).Validate()
			if tc.wantErr == "" && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func localListener(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// start runs the controller until the test ends, then checks that it
// stopped cleanly.
func start(t *testing.T, cfg *Config) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return ctx
}

// TestRun runs the whole controller against a fake API server: the
// webhook over HTTPS with the self-managed CA, health, metrics, and the
// leader's node labels and DeviceClasses.
func TestRun(t *testing.T) {
	const ns = "gpu-dra"
	client := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}},
		&admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: "gpu-dra-driver-webhook"},
			Webhooks:   []admissionregistrationv1.ValidatingWebhook{{Name: "claims.gpu.dra.dev"}},
		},
		&admissionregistrationv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: "gpu-dra-driver-request-translation"},
			Webhooks:   []admissionregistrationv1.MutatingWebhook{{Name: "pods.translate.gpu.dra.dev"}},
		},
		&resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.dra.dev"}, Spec: resourceapi.DeviceClassSpec{ExtendedResourceName: ptr.To("nvidia.com/gpu")}},
	)
	cfg := defaults(t, "--namespace="+ns, "--model-device-classes", "--leader-elect-identity=test", "--mutating-webhook-configuration-name=gpu-dra-driver-request-translation")
	cfg.KubeClient = client
	webhookLn, httpLn := localListener(t), localListener(t)
	cfg.WebhookListener, cfg.HTTPListener = webhookLn, httpLn
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx := start(t, cfg)

	httpURL := "http://" + httpLn.Addr().String()
	poll(t, "ready", func() bool { code, _ := get(httpURL + "/readyz"); return code == http.StatusOK })
	if code, body := get(httpURL + "/healthz?verbose"); code != http.StatusOK || !strings.Contains(body, "[+]leader-election ok") {
		t.Errorf("/healthz: %d %s", code, body)
	}

	// The webhook, over TLS, trusted through the bundle patched into the
	// webhook configuration. The controller serves before it patches the
	// bundle (certs.Manager.Reconcile), so wait for the bundle.
	pool := x509.NewCertPool()
	poll(t, "CA bundle in the webhook configuration", func() bool {
		vwc, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "gpu-dra-driver-webhook", metav1.GetOptions{})
		return err == nil && pool.AppendCertsFromPEM(vwc.Webhooks[0].ClientConfig.CABundle)
	})
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: "gpu-dra-controller." + ns + ".svc", MinVersion: tls.VersionTLS12,
	}}}
	review := fmt.Sprintf(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE",
		"resource":{"group":"resource.k8s.io","version":"v1","resource":"resourceclaims"},
		"object":{"spec":{"devices":{"config":[{"opaque":{"driver":"gpu.dra.dev","parameters":%s}}]}}}}}`,
		`{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"Bogus"}}`)
	resp, err := hc.Post("https://"+webhookLn.Addr().String()+"/validate", "application/json", bytes.NewReader([]byte(review)))
	if err != nil {
		t.Fatalf("webhook over TLS: %v", err)
	}
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if out.Response == nil || out.Response.Allowed || !strings.Contains(out.Response.Result.Message, "spec.devices.config[0].opaque.parameters: sharing.strategy: Unsupported value: \"Bogus\"") {
		t.Fatalf("webhook response %+v", out.Response)
	}
	if _, err := client.CoreV1().Secrets(ns).Get(ctx, "gpu-dra-controller-webhook-tls", metav1.GetOptions{}); err != nil {
		t.Errorf("TLS Secret: %v", err)
	}

	// The request translation, on /mutate by default for volcano, with the
	// CA bundle in its configuration.
	poll(t, "CA bundle in the mutating webhook configuration", func() bool {
		mwc, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "gpu-dra-driver-request-translation", metav1.GetOptions{})
		return err == nil && len(mwc.Webhooks[0].ClientConfig.CABundle) > 0
	})
	podReview := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"2","operation":"CREATE","namespace":"team",
		"resource":{"group":"","version":"v1","resource":"pods"},
		"object":{"metadata":{"name":"p"},"spec":{"schedulerName":"volcano","containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"2"}}}]}}}}`
	resp, err = hc.Post("https://"+webhookLn.Addr().String()+"/mutate", "application/json", strings.NewReader(podReview))
	if err != nil {
		t.Fatalf("mutating webhook over TLS: %v", err)
	}
	out = admissionv1.AdmissionReview{}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if out.Response == nil || !out.Response.Allowed || !strings.Contains(string(out.Response.Patch), "gpu.dra.dev-x2") {
		t.Fatalf("mutating webhook response %+v", out.Response)
	}
	if _, err := client.ResourceV1().ResourceClaimTemplates("team").Get(ctx, "gpu.dra.dev-x2", metav1.GetOptions{}); err != nil {
		t.Errorf("translation's ResourceClaimTemplate: %v", err)
	}

	// The leader labels nodes and creates model classes.
	for i, s := range simnode.New(t, "l4x4", "node-a").Slices("gpu.dra.dev") {
		s.Name = fmt.Sprintf("node-a-%d", i)
		if _, err := client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, "node labels", func() bool {
		n, err := client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		return err == nil && n.Labels[nodelabels.LabelProduct] == "NVIDIA-L4"
	})
	poll(t, "model class", func() bool {
		_, err := client.ResourceV1().DeviceClasses().Get(ctx, "nvidia-l4.gpu.dra.dev", metav1.GetOptions{})
		return err == nil
	})
	if lease, err := client.CoordinationV1().Leases(ns).Get(ctx, "gpu-dra-controller", metav1.GetOptions{}); err != nil || *lease.Spec.HolderIdentity != "test" {
		t.Errorf("lease: %v %+v", err, lease)
	}

	// The metrics live in the process-wide registry, so other runs in this
	// process (-count) add to them: check presence, not values.
	_, body := get(httpURL + "/metrics")
	for _, m := range []string{
		`gpu_dra_controller_admission_rejections_total{reason="invalid",resource="resourceclaims"} `,
		`gpu_dra_controller_admission_duration_seconds_count{allowed="false",resource="resourceclaims"} `,
		`gpu_dra_controller_node_labels_written_total{action="set"} `,
		`gpu_dra_controller_request_translations_total{resource="pods"} `,
		`gpu_dra_controller_webhook_certificates_generated_total{kind="serving"} `,
		`gpu_dra_controller_model_deviceclass_changes_total{action="create"} `,
		`leader_election_master_status{name="gpu-dra-controller"} 1`,
		`workqueue_adds_total{name="gpu_dra_node_labels"} `,
	} {
		if !strings.Contains(body, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
}

// runWithCertFiles runs the webhook only, with a certificate as cert-manager
// would issue it, and waits until it is ready. The returned function stops
// it and checks that it stopped cleanly.
func runWithCertFiles(t *testing.T, args ...string) (*Config, func()) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile := dir+"/tls.crt", dir+"/tls.key"
	src, err := certs.NewManager(fake.NewClientset(), certs.Config{Namespace: "x", SecretName: "s", DNSNames: []string{"webhook.example"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, _ := src.GetCertificate(nil)
	writePEM(t, certFile, "CERTIFICATE", c.Certificate[0])
	keyDER, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)

	cfg := defaults(t, append([]string{"--tls-cert-file=" + certFile, "--tls-key-file=" + keyFile, "--leader-elect=false", "--node-labels=false", "--outage-taints=false"}, args...)...)
	cfg.KubeClient = fake.NewClientset()
	cfg.WebhookListener, cfg.HTTPListener = localListener(t), localListener(t)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	poll(t, "ready", func() bool {
		code, _ := get("http://" + cfg.HTTPListener.Addr().String() + "/readyz")
		return code == http.StatusOK
	})
	return cfg, func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func TestRunWithCertFilesAndNoLeaderElection(t *testing.T) {
	cfg, stop := runWithCertFiles(t)
	defer stop()
	conn, err := tls.Dial("tcp", cfg.WebhookListener.Addr().String(), &tls.Config{InsecureSkipVerify: true}) // only checks which certificate is served
	if err != nil {
		t.Fatal(err)
	}
	if got := conn.ConnectionState().PeerCertificates[0].DNSNames; len(got) != 1 || got[0] != "webhook.example" {
		t.Errorf("served certificate for %v", got)
	}
	_ = conn.Close()
}

// TestWebhookCutsOffSlowClients: a client that never finishes its TLS
// handshake, its headers or its body loses the connection after
// --webhook-request-timeout (tiny here), not after minutes or never.
func TestWebhookCutsOffSlowClients(t *testing.T) {
	cfg, stop := runWithCertFiles(t, "--webhook-request-timeout=200ms")
	defer stop()
	addr := cfg.WebhookListener.Addr().String()
	dialTLS := func(t *testing.T) net.Conn {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		return conn
	}
	tests := map[string]func(t *testing.T) net.Conn{
		"no TLS handshake": func(t *testing.T) net.Conn {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			return conn
		},
		"unfinished headers": func(t *testing.T) net.Conn {
			conn := dialTLS(t)
			if _, err := io.WriteString(conn, "POST /validate HTTP/1.1\r\nHost: webhook.example\r\n"); err != nil {
				t.Fatal(err)
			}
			return conn
		},
		"unfinished body": func(t *testing.T) net.Conn {
			conn := dialTLS(t)
			if _, err := io.WriteString(conn, "POST /validate HTTP/1.1\r\nHost: webhook.example\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"kind\":"); err != nil {
				t.Fatal(err)
			}
			return conn
		},
	}
	for name, open := range tests {
		t.Run(name, func(t *testing.T) {
			conn := open(t)
			defer func() { _ = conn.Close() }()
			// Far above the server's timeout, far below "never".
			if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err := io.Copy(io.Discard, conn)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the server still holds the connection after %v", time.Since(start))
			}
		})
	}
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 15*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// TestRunReturnsWhenAServerCannotListen: a server that cannot listen ends
// Run with its error, in bounded time, after the components already
// started (the webhook's certificate source, the controllers) stopped.
func TestRunReturnsWhenAServerCannotListen(t *testing.T) {
	tests := map[string]struct {
		args    []string
		wantErr string
	}{
		"webhook": {args: []string{"--webhook-address=127.0.0.1:-1"}, wantErr: "webhook"},
		"health":  {args: []string{"--http-address=127.0.0.1:-1"}, wantErr: "health and metrics"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := defaults(t, append([]string{"--namespace=gpu-dra", "--leader-elect=false"}, tc.args...)...)
			cfg.KubeClient = fake.NewClientset()
			// The server that can listen does so on a port of its own.
			if cfg.HTTPAddress != "127.0.0.1:-1" {
				cfg.HTTPListener = localListener(t)
			} else {
				cfg.WebhookListener = localListener(t)
			}
			done := make(chan error, 1)
			go func() { done <- Run(context.Background(), cfg) }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one about %q", err, tc.wantErr)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not return")
			}
		})
	}
}

// TestHealthEndpoints: until the webhook certificate is loaded, /readyz
// fails and names the failing checks (the serving path's round trip fails
// too), while /healthz and /livez pass; the
// checks are listed with ?verbose and each has its own path.
func TestHealthEndpoints(t *testing.T) {
	dir := t.TempDir()
	cfg := defaults(t, "--tls-cert-file="+dir+"/tls.crt", "--tls-key-file="+dir+"/tls.key", "--leader-elect=false", "--node-labels=false", "--outage-taints=false")
	cfg.KubeClient = fake.NewClientset()
	cfg.WebhookListener, cfg.HTTPListener = localListener(t), localListener(t)
	start(t, cfg)
	base := "http://" + cfg.HTTPListener.Addr().String()
	poll(t, "health server", func() bool { code, _ := get(base + "/livez"); return code == http.StatusOK })
	for _, tc := range []struct {
		path     string
		wantCode int
		want     []string
	}{
		{"/readyz", http.StatusInternalServerError, []string{"[-]webhook-certificate failed", "[+]webhook-server ok"}},
		{"/readyz/webhook-certificate", http.StatusInternalServerError, nil},
		{"/readyz/webhook-server", http.StatusOK, []string{"ok"}},
		// No certificate yet: the serving path cannot answer.
		{"/readyz/webhook-serving", http.StatusInternalServerError, nil},
		{"/healthz", http.StatusOK, []string{"ok"}},
		{"/livez?verbose", http.StatusOK, []string{"[+]ping ok"}},
	} {
		var code int
		var body string
		matches := func() bool {
			code, body = get(base + tc.path)
			for _, w := range tc.want {
				if !strings.Contains(body, w) {
					return false
				}
			}
			return code == tc.wantCode
		}
		deadline := time.Now().Add(15 * time.Second)
		for !matches() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d %q, want %d with %q", tc.path, code, body, tc.wantCode, tc.want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// The chart renders --request-translation-schedulers= (empty) to turn the
// translation off, and a comma-separated list otherwise.
func TestRequestTranslationFlags(t *testing.T) {
	for args, want := range map[string][]string{
		"":                                  {"volcano"},
		"--request-translation-schedulers=": nil,
		"--request-translation-schedulers=volcano,kai-scheduler": {"volcano", "kai-scheduler"},
	} {
		var argv []string
		if args != "" {
			argv = []string{args}
		}
		cfg := defaults(t, append(argv, "--namespace=gpu")...)
		if len(cfg.RequestTranslation.Schedulers) != len(want) || len(want) > 0 && !slices.Equal(cfg.RequestTranslation.Schedulers, want) {
			t.Errorf("%q: schedulers %q, want %q", args, cfg.RequestTranslation.Schedulers, want)
		}
		if got, wantOn := cfg.translationEnabled(), len(want) > 0; got != wantOn {
			t.Errorf("%q: translation enabled %v, want %v", args, got, wantOn)
		}
	}
}
