package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/certs"
)

// Short lifetimes for TestControllerCertificateRotation. A serving certificate
// issued at t is renewed at t+20s; the CA is renewed at 30s, and serving moves
// to it at 35s, while the certificate it replaces is valid until 45s.
const (
	rotationCertValidity = 30 * time.Second
	rotationCAValidity   = 45 * time.Second
	rotationPropagation  = 5 * time.Second
	// backdate is how far pkg/controller/certs puts NotBefore before issuance.
	backdate = 5 * time.Minute
)

// TestControllerCertificateRotation: with short validities, the self-managed
// TLS on the real API server renews the serving certificate, then the CA:
// the new CA joins the bundle of every webhook next to the old one, serving
// moves to it only after --ca-propagation-delay, and the replicas serve what
// the Secret holds. Admissions attempted every 200 ms throughout are all
// rejected by the webhook itself: the API server never fails to call it.
func TestControllerCertificateRotation(t *testing.T) {
	ctx := testContext(t)
	client := env.cluster.Client
	secretName, vwcName := controllerArg(t, ctx, "tls-secret-name"), controllerArg(t, ctx, "webhook-configuration-name")
	// Fresh long-lived material after the release is restored (cleanups run
	// last in, first out).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := client.CoreV1().Secrets(env.namespace).Delete(ctx, secretName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete Secret %s: %v", secretName, err)
		}
		waitWebhookRejects(t, ctx)
	})
	saveRelease(t, ctx)
	upgradeRelease(t, ctx, "--set-json", fmt.Sprintf(`controller.extraArgs=["--cert-validity=%s","--ca-validity=%s","--ca-propagation-delay=%s"]`,
		rotationCertValidity, rotationCAValidity, rotationPropagation))
	// Validities apply to new certificates: start from none.
	if err := client.CoreV1().Secrets(env.namespace).Delete(ctx, secretName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var first *tlsState
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		first = readTLSState(ctx, secretName, vwcName)
		return first != nil && first.cas[0].NotAfter.Sub(time.Now()) <= rotationCAValidity, nil
	})
	if err != nil {
		t.Fatalf("no short-lived CA in Secret %s: %v", secretName, err)
	}
	waitServed(t, ctx, first.serving)
	waitWebhookRejects(t, ctx)
	t.Logf("CA %s, serving certificate %s", describe(first.cas[0]), describe(first.serving))

	stop := admitInLoop(t, ctx)
	var servingRenewed, caAdded, moved *tlsState
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*rotationCAValidity, true, func(ctx context.Context) (bool, error) {
		s := readTLSState(ctx, secretName, vwcName)
		if s == nil {
			return false, nil
		}
		switch {
		case servingRenewed == nil && !s.serving.Equal(first.serving) && s.signedBy(first.cas[0]):
			servingRenewed = s
			t.Logf("serving certificate renewed: %s", describe(s.serving))
		case caAdded == nil && len(s.cas) == 2 && s.cas[1].Equal(first.cas[0]) && s.bundlesHold(s.cas...):
			caAdded = s
			t.Logf("new CA %s; the bundle of every webhook holds it and the old CA; serving signed by the old CA: %v", describe(s.cas[0]), s.signedBy(first.cas[0]))
		case caAdded != nil && s.signedBy(caAdded.cas[0]):
			moved = s
			t.Logf("serving certificate moved to the new CA: %s", describe(s.serving))
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("rotation incomplete after %v: serving renewed %v, CA added %v, serving moved %v: %v",
			2*rotationCAValidity, servingRenewed != nil, caAdded != nil, moved != nil, err)
	}
	if servingRenewed == nil {
		t.Error("the serving certificate was not renewed under the first CA")
	}
	// Serving moves to the new CA only after the propagation delay.
	if issued, earliest := moved.serving.NotBefore.Add(backdate), caAdded.cas[0].NotBefore.Add(backdate+rotationPropagation); issued.Before(earliest.Add(-time.Second)) {
		t.Errorf("serving certificate of the new CA issued at %v, before the propagation delay ended (%v)", issued, earliest)
	}
	waitServed(t, ctx, moved.serving)
	ok, failures := stop()
	t.Logf("%d admissions during the rotation, all rejected by the webhook", ok)
	for _, f := range failures {
		t.Error(f)
	}
	if ok < 20 {
		t.Errorf("only %d admissions during the rotation", ok)
	}
}

// tlsState is the Secret's CA bundle and serving certificate, with the CA
// bundles of the webhooks.
type tlsState struct {
	cas      []*x509.Certificate
	serving  *x509.Certificate
	webhooks [][]byte
}

func (s *tlsState) signedBy(ca *x509.Certificate) bool {
	return s.serving.CheckSignatureFrom(ca) == nil
}

// bundlesHold reports whether every webhook's caBundle holds all of cas.
func (s *tlsState) bundlesHold(cas ...*x509.Certificate) bool {
	for _, b := range s.webhooks {
		for _, ca := range cas {
			if !bytes.Contains(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})) {
				return false
			}
		}
	}
	return len(s.webhooks) > 0
}

// readTLSState reads the Secret and the webhook configuration; nil while the
// Secret is missing or incomplete.
func readTLSState(ctx context.Context, secretName, vwcName string) *tlsState {
	secret, err := env.cluster.Client.CoreV1().Secrets(env.namespace).Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	s := &tlsState{cas: parsePEMCerts(secret.Data[certs.KeyCABundle])}
	if servings := parsePEMCerts(secret.Data[corev1.TLSCertKey]); len(servings) > 0 {
		s.serving = servings[0]
	}
	if len(s.cas) == 0 || s.serving == nil {
		return nil
	}
	vwc, err := env.cluster.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, vwcName, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	for _, wh := range vwc.Webhooks {
		s.webhooks = append(s.webhooks, wh.ClientConfig.CABundle)
	}
	return s
}

func parsePEMCerts(data []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		if block, data = pem.Decode(data); block == nil {
			return out
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

func describe(c *x509.Certificate) string {
	return fmt.Sprintf("%s (serial %x, not after %s)", c.Subject.CommonName, c.SerialNumber.Bytes()[:4], c.NotAfter.Format(time.TimeOnly))
}

// waitServed waits until every controller replica serves cert on its webhook
// port (pod IPs are reachable from the node).
func waitServed(t *testing.T, ctx context.Context, cert *x509.Certificate) {
	t.Helper()
	port := controllerArg(t, ctx, "webhook-address")
	var last string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		pods, err := env.cluster.Client.CoreV1().Pods(env.namespace).List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/component=controller,app.kubernetes.io/instance=" + env.release,
		})
		if err != nil || len(pods.Items) == 0 {
			return false, err
		}
		for _, p := range pods.Items {
			d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // only reads the peer certificate
			conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(p.Status.PodIP, strings.TrimPrefix(port, ":")))
			if err != nil {
				last = fmt.Sprintf("pod %s: %v", p.Name, err)
				return false, nil
			}
			peer := conn.(*tls.Conn).ConnectionState().PeerCertificates[0]
			_ = conn.Close()
			if !peer.Equal(cert) {
				last = fmt.Sprintf("pod %s serves %s", p.Name, describe(peer))
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("the replicas do not serve the Secret's certificate: %v; %s", err, last)
	}
}

// admitInLoop dry-runs the invalid admission case every 200 ms until stop,
// which returns how many the webhook rejected and what else happened.
func admitInLoop(t *testing.T, ctx context.Context) (stop func() (ok int, failures []string)) {
	c := admissionCase(t, invalidCase)
	claim := caseClaim(t, c, "default")
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg       sync.WaitGroup
		ok       int
		failures []string
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			err := webhookRejects(ctx, claim, c.Field)
			switch {
			case ctx.Err() != nil:
				return
			case err == nil:
				ok++
			default:
				failures = append(failures, fmt.Sprintf("%s: %v", time.Now().Format(time.TimeOnly), err))
			}
		}
	}()
	return func() (int, []string) {
		cancel()
		wg.Wait()
		return ok, failures
	}
}
