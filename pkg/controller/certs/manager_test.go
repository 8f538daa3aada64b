package certs

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
	testingclock "k8s.io/utils/clock/testing"
)

const (
	ns         = "gpu-dra"
	secretName = "webhook-tls"
	vwcName    = "gpu-dra-webhook"
)

var (
	start    = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	dnsNames = ServiceDNSNames("gpu-dra-controller", ns, "cluster.local")
)

func webhookConfig() *admissionregistrationv1.ValidatingWebhookConfiguration {
	svc := &admissionregistrationv1.ServiceReference{Namespace: ns, Name: "gpu-dra-controller"}
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: vwcName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{Name: "claims.gpu.dra.dev", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: svc}},
			{Name: "classes.gpu.dra.dev", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: svc}},
		},
	}
}

type fixture struct {
	client *fake.Clientset
	clock  *testingclock.FakeClock
	cfg    Config
}

func newFixture(t *testing.T, objs ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{client: fake.NewClientset(objs...), clock: testingclock.NewFakeClock(start)}
	f.cfg = Config{
		Namespace: ns, SecretName: secretName, WebhookConfigName: vwcName, DNSNames: dnsNames,
		CAValidity: 300 * 24 * time.Hour, CertValidity: 30 * 24 * time.Hour,
		PropagationDelay: 5 * time.Minute, Clock: f.clock,
	}
	return f
}

func (f *fixture) manager(t *testing.T) *Manager {
	t.Helper()
	m, err := NewManager(f.client, f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func reconcile(t *testing.T, m *Manager) time.Duration {
	t.Helper()
	after, err := m.Reconcile(context.Background())
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return after
}

func (f *fixture) secret(t *testing.T) *corev1.Secret {
	t.Helper()
	s, err := f.client.CoreV1().Secrets(ns).Get(context.Background(), secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (f *fixture) bundles(t *testing.T) [][]*x509.Certificate {
	t.Helper()
	vwc, err := f.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), vwcName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out [][]*x509.Certificate
	for _, wh := range vwc.Webhooks {
		cas, err := certutil.ParseCertsPEM(wh.ClientConfig.CABundle)
		if err != nil {
			t.Fatalf("webhook %s: CA bundle: %v", wh.Name, err)
		}
		out = append(out, cas)
	}
	return out
}

// serving is the certificate the manager serves.
func serving(t *testing.T, m *Manager) *x509.Certificate {
	t.Helper()
	c, err := m.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	return c.Leaf
}

// verify checks that the API server, trusting bundle, accepts cert at now.
func verify(t *testing.T, cert *x509.Certificate, bundle []*x509.Certificate, now time.Time) {
	t.Helper()
	pool := x509.NewCertPool()
	for _, c := range bundle {
		pool.AddCert(c)
	}
	if _, err := cert.Verify(x509.VerifyOptions{
		DNSName: "gpu-dra-controller.gpu-dra.svc", Roots: pool, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		t.Fatalf("serving certificate not trusted: %v", err)
	}
}

func countWrites(client *fake.Clientset, resource string) int {
	n := 0
	for _, a := range client.Actions() {
		if a.GetResource().Resource == resource && (a.GetVerb() == "create" || a.GetVerb() == "update") {
			n++
		}
	}
	return n
}

func TestManagerFirstRun(t *testing.T) {
	f := newFixture(t, webhookConfig())
	m := f.manager(t)
	if m.Ready() == nil {
		t.Fatal("ready before reconcile")
	}
	after := reconcile(t, m)
	if err := m.Ready(); err != nil {
		t.Fatal(err)
	}

	s := f.secret(t)
	if s.Type != corev1.SecretTypeTLS || s.Labels[ManagedByLabel] != ManagedByValue {
		t.Errorf("secret type %q labels %v", s.Type, s.Labels)
	}
	for _, k := range []string{KeyCABundle, KeyCAKey, KeyCert, KeyKey} {
		if len(s.Data[k]) == 0 {
			t.Errorf("secret lacks %s", k)
		}
	}
	bundles := f.bundles(t)
	if len(bundles) != 2 {
		t.Fatalf("%d webhooks", len(bundles))
	}
	for _, b := range bundles {
		if len(b) != 1 || !b[0].IsCA {
			t.Fatalf("bundle = %d certs", len(b))
		}
	}
	cert := serving(t, m)
	verify(t, cert, bundles[0], start)
	if !sameNames(cert.DNSNames, dnsNames) {
		t.Errorf("DNS names %v, want %v", cert.DNSNames, dnsNames)
	}
	if after != resync {
		t.Errorf("recheck after %v, want the resync period %v (the certificates are far from due)", after, resync)
	}
	f.clock.SetTime(RotateAt(cert).Add(-time.Minute))
	if after := reconcile(t, m); after != time.Minute {
		t.Errorf("recheck after %v, want 1m: when the serving certificate is due", after)
	}

	// Nothing to do the second time.
	client := f.client
	client.ClearActions()
	reconcile(t, m)
	if n := countWrites(client, "secrets") + countWrites(client, "validatingwebhookconfigurations"); n != 0 {
		t.Errorf("second reconcile wrote %d times", n)
	}
}

func TestManagerServesTLS(t *testing.T) {
	f := newFixture(t, webhookConfig())
	f.clock.SetTime(time.Now())
	m := f.manager(t)
	reconcile(t, m)

	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	srv.TLS = &tls.Config{GetCertificate: m.GetCertificate, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()
	pool := x509.NewCertPool()
	for _, c := range f.bundles(t)[0] {
		pool.AddCert(c)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: "gpu-dra-controller.gpu-dra.svc", MinVersion: tls.VersionTLS12,
	}}}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatalf("TLS request with the patched CA bundle: %v", err)
	}
	_ = resp.Body.Close()
}

func TestManagerRotatesServingCert(t *testing.T) {
	f := newFixture(t, webhookConfig())
	m := f.manager(t)
	reconcile(t, m)
	first := serving(t, m)
	ca := f.bundles(t)[0][0]

	f.clock.SetTime(RotateAt(first).Add(-time.Minute))
	reconcile(t, m)
	if !serving(t, m).Equal(first) {
		t.Fatal("rotated before two thirds of the lifetime")
	}

	f.clock.SetTime(RotateAt(first).Add(time.Second))
	reconcile(t, m)
	second := serving(t, m)
	if second.Equal(first) {
		t.Fatal("not rotated after two thirds of the lifetime")
	}
	b := f.bundles(t)[0]
	if len(b) != 1 || !b[0].Equal(ca) {
		t.Error("CA bundle changed on a serving rotation")
	}
	verify(t, second, b, f.clock.Now())
	// The new certificate comes from the Secret, so other replicas serve it.
	if got, _ := certutil.ParseCertsPEM(f.secret(t).Data[KeyCert]); !got[0].Equal(second) {
		t.Error("Secret does not hold the served certificate")
	}
}

// untilNewCA reconciles day by day, as Run would, until a second CA joins
// the bundle, and returns the old CA.
func untilNewCA(t *testing.T, f *fixture, m *Manager) *x509.Certificate {
	t.Helper()
	oldCA := f.bundles(t)[0][0]
	for day := 0; ; day++ {
		if day > 400 {
			t.Fatal("no CA rotation within 400 days")
		}
		f.clock.Step(24 * time.Hour)
		_, _ = m.Reconcile(context.Background())
		if b := f.bundles(t)[0]; len(b) > 1 || !b[0].Equal(oldCA) {
			break
		}
		// Serving stays valid throughout.
		verify(t, serving(t, m), f.bundles(t)[0], f.clock.Now())
	}
	if f.clock.Now().Before(RotateAt(oldCA)) {
		t.Fatalf("CA rotated at %v, before two thirds of its life (%v)", f.clock.Now(), RotateAt(oldCA))
	}
	return oldCA
}

func TestManagerRotatesCA(t *testing.T) {
	f := newFixture(t, webhookConfig())
	m := f.manager(t)
	reconcile(t, m)

	// Past two thirds of the CA's life a new CA joins the bundle; the
	// serving certificate stays on the old one for now.
	oldCA := untilNewCA(t, f, m)
	b := f.bundles(t)[0]
	if len(b) != 2 || !b[1].Equal(oldCA) || b[0].Equal(oldCA) {
		t.Fatalf("bundle after CA rotation: %d certs, want new CA then old", len(b))
	}
	newCA := b[0]
	cur := serving(t, m)
	if cur.CheckSignatureFrom(oldCA) != nil {
		t.Fatal("serving certificate moved to the new CA before the bundle propagated")
	}
	verify(t, cur, b, f.clock.Now())
	if after := reconcile(t, m); after > f.cfg.PropagationDelay {
		t.Errorf("recheck after %v, want at most the propagation delay %v", after, f.cfg.PropagationDelay)
	}

	// After the propagation delay, serving moves to the new CA.
	f.clock.Step(f.cfg.PropagationDelay)
	reconcile(t, m)
	cur = serving(t, m)
	if cur.CheckSignatureFrom(newCA) != nil {
		t.Fatal("serving certificate not moved to the new CA after the propagation delay")
	}
	verify(t, cur, f.bundles(t)[0], f.clock.Now())

	// Once the old CA expires it leaves the bundle.
	f.clock.SetTime(oldCA.NotAfter.Add(time.Second))
	reconcile(t, m)
	if b := f.bundles(t)[0]; len(b) != 1 || !b[0].Equal(newCA) {
		t.Errorf("bundle after the old CA expired: %d certs", len(b))
	}
}

func TestManagerWaitsForBundleBeforeNewCA(t *testing.T) {
	f := newFixture(t, webhookConfig())
	m := f.manager(t)
	reconcile(t, m)
	oldCA := f.bundles(t)[0][0]

	// From just before the CA rotation on, the webhook configuration
	// cannot be updated: the API server never gets the new CA, so serving
	// must stay on the old one.
	f.clock.SetTime(RotateAt(oldCA).Add(-time.Hour))
	reconcile(t, m)
	f.client.PrependReactor("update", "validatingwebhookconfigurations", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("forbidden")
	})
	for range 10 {
		f.clock.Step(time.Hour)
		if _, err := m.Reconcile(context.Background()); err == nil {
			t.Fatal("no error although the CA bundle could not be patched")
		}
	}
	if f.secret(t).Data[KeyCABundle] == nil || len(mustParse(t, f.secret(t).Data[KeyCABundle])) != 2 {
		t.Fatal("no new CA in the Secret")
	}
	if serving(t, m).CheckSignatureFrom(oldCA) != nil {
		t.Fatal("serving certificate moved to a CA the API server does not have")
	}
}

func mustParse(t *testing.T, pemData []byte) []*x509.Certificate {
	t.Helper()
	c, err := certutil.ParseCertsPEM(pemData)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestManagerServesWithoutWebhookConfig(t *testing.T) {
	f := newFixture(t) // no ValidatingWebhookConfiguration yet
	m := f.manager(t)
	if _, err := m.Reconcile(context.Background()); err == nil {
		t.Error("no error for a missing webhook configuration")
	}
	if err := m.Ready(); err != nil {
		t.Errorf("not serving while the webhook configuration is missing: %v", err)
	}
	if _, err := f.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(context.Background(), webhookConfig(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reconcile(t, m)
	verify(t, serving(t, m), f.bundles(t)[0], start)
}

func TestManagerReplicasShareTheSecret(t *testing.T) {
	f := newFixture(t, webhookConfig())
	a, b := f.manager(t), f.manager(t)
	reconcile(t, a)
	f.client.ClearActions()
	reconcile(t, b)
	if !serving(t, a).Equal(serving(t, b)) {
		t.Error("replicas serve different certificates")
	}
	if n := countWrites(f.client, "secrets"); n != 0 {
		t.Errorf("second replica wrote the Secret %d times", n)
	}
}

func TestManagerRepairsSecret(t *testing.T) {
	tests := map[string]map[string][]byte{
		"garbage":          {KeyCABundle: []byte("junk"), KeyCAKey: []byte("junk"), KeyCert: []byte("junk"), KeyKey: []byte("junk")},
		"empty":            {},
		"cert without key": nil, // filled below
		"foreign CA key":   nil,
		"other DNS names":  nil,
		"unsigned by a CA": nil,
	}
	// Material from another, valid installation to mix.
	other := newFixture(t, webhookConfig())
	other.cfg.DNSNames = []string{"elsewhere"}
	om := other.manager(t)
	reconcile(t, om)
	o := other.secret(t).Data
	ours := newFixture(t, webhookConfig())
	reconcile(t, ours.manager(t))
	u := ours.secret(t).Data
	tests["cert without key"] = map[string][]byte{KeyCABundle: u[KeyCABundle], KeyCAKey: u[KeyCAKey], KeyCert: u[KeyCert]}
	tests["foreign CA key"] = map[string][]byte{KeyCABundle: u[KeyCABundle], KeyCAKey: o[KeyCAKey], KeyCert: u[KeyCert], KeyKey: u[KeyKey]}
	tests["other DNS names"] = map[string][]byte{KeyCABundle: o[KeyCABundle], KeyCAKey: o[KeyCAKey], KeyCert: o[KeyCert], KeyKey: o[KeyKey]}
	tests["unsigned by a CA"] = map[string][]byte{KeyCABundle: o[KeyCABundle], KeyCAKey: o[KeyCAKey], KeyCert: u[KeyCert], KeyKey: u[KeyKey]}

	for name, data := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, webhookConfig(), &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: ns, Labels: map[string]string{"keep": "me"}},
				Data:       data,
			})
			m := f.manager(t)
			reconcile(t, m)
			s := f.secret(t)
			if s.Labels["keep"] != "me" {
				t.Error("update dropped a foreign label")
			}
			verify(t, serving(t, m), f.bundles(t)[0], start)
			if !sameNames(serving(t, m).DNSNames, dnsNames) {
				t.Errorf("DNS names %v", serving(t, m).DNSNames)
			}
		})
	}
}

func TestNewManagerValidates(t *testing.T) {
	client := fake.NewClientset()
	for name, cfg := range map[string]Config{
		"no namespace":     {SecretName: "s", DNSNames: dnsNames},
		"no secret":        {Namespace: ns, DNSNames: dnsNames},
		"no DNS names":     {Namespace: ns, SecretName: "s"},
		"cert outlives CA": {Namespace: ns, SecretName: "s", DNSNames: dnsNames, CAValidity: time.Hour, CertValidity: 2 * time.Hour},
	} {
		if _, err := NewManager(client, cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestManagerRun(t *testing.T) {
	f := newFixture(t, webhookConfig())
	f.cfg.Clock = nil // real time: Run waits on timers
	m := f.manager(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for m.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatal("not ready after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	first := serving(t, m)

	// Another replica (or an admin) replaces the Secret: Run picks it up.
	if err := f.client.CoreV1().Secrets(ns).Delete(ctx, secretName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for serving(t, m).Equal(first) {
		if time.Now().After(deadline) {
			t.Fatal("deleted Secret not regenerated within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestManagerReusesKeysInEveryPEMFormat: a Secret whose CA key is PKCS#8
// (what earlier releases wrote), SEC1 (what keyutil writes) or PKCS#1 RSA
// (written by hand) is used as it is: no new CA, no write.
func TestManagerReusesKeysInEveryPEMFormat(t *testing.T) {
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(ecKey)
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		key    crypto.Signer
		keyPEM []byte
	}{
		"PKCS#8": {ecKey, pem.EncodeToMemory(&pem.Block{Type: keyutil.PrivateKeyBlockType, Bytes: pkcs8})},
		"SEC1":   {ecKey, mustPEM(t, ecKey)},
		"PKCS#1": {rsaKey, mustPEM(t, rsaKey)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tmpl := &x509.Certificate{
				SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
				NotBefore: start.Add(-time.Hour), NotAfter: start.Add(300 * 24 * time.Hour),
				KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
			}
			ca, err := sign(tmpl, tmpl, tc.key, tc.key)
			if err != nil {
				t.Fatal(err)
			}
			pair, err := newServing(ca, start, 30*24*time.Hour, dnsNames)
			if err != nil {
				t.Fatal(err)
			}
			data := map[string][]byte{KeyCABundle: ca.certPEM, KeyCAKey: tc.keyPEM, KeyCert: pair.certPEM, KeyKey: pair.keyPEM}
			vwc := webhookConfig()
			for i := range vwc.Webhooks {
				vwc.Webhooks[i].ClientConfig.CABundle = ca.certPEM
			}
			f := newFixture(t, vwc, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: ns}, Data: data})
			m := f.manager(t)
			reconcile(t, m)
			if n := countWrites(f.client, "secrets"); n != 0 {
				t.Errorf("Secret written %d times; its CA key was not used", n)
			}
			if !serving(t, m).Equal(pair.cert) {
				t.Error("the Secret's serving certificate is not served")
			}
		})
	}
}

func mustPEM(t *testing.T, key crypto.PrivateKey) []byte {
	t.Helper()
	b, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The request translation's MutatingWebhookConfiguration gets the same CA
// bundle as the validating one.
func TestManagerPatchesMutatingWebhookConfig(t *testing.T) {
	const mwcName = "gpu-dra-driver-request-translation"
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: mwcName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			{Name: "pods.translate.gpu.dra.dev"}, {Name: "jobs.translate.gpu.dra.dev"},
		},
	}
	f := newFixture(t, webhookConfig(), mwc)
	f.cfg.MutatingWebhookConfigName = mwcName
	reconcile(t, f.manager(t))
	want := f.secret(t).Data[KeyCABundle]
	got, err := f.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), mwcName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, wh := range got.Webhooks {
		if !bytes.Equal(wh.ClientConfig.CABundle, want) {
			t.Errorf("webhook %s: CA bundle %q, want the Secret's %q", wh.Name, wh.ClientConfig.CABundle, want)
		}
	}
}
