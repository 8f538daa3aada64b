package controller

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/apiserver/pkg/server/healthz"
)

// webhookProbePath is served on the webhook's listener for the readiness
// check, beside webhook.Path, so that probes neither reach the admission
// handler nor count as bad admission requests in its metrics.
const webhookProbePath = "/webhook-serving"

// webhookProbeHandler answers the readiness check's request.
var webhookProbeHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })

// webhookProbeTimeout bounds the readiness check's round trip through the
// webhook server.
const webhookProbeTimeout = 2 * time.Second

// webhookServingCheck fails unless a request to the webhook's own listener
// is answered: TLS handshake (the serving certificate), accept loop and
// mux, the path the API server's admission calls take up to the handler.
// The certificate is not verified here: its validity for the Service is
// what the webhook-certificate check and the CA bundle are about.
func webhookServingCheck(addr net.Addr) healthz.HealthChecker {
	client := &http.Client{
		Timeout: webhookProbeTimeout,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, //nolint:gosec // liveness of the serving path only, see above
			DisableKeepAlives: true,
		},
	}
	url := "https://" + loopback(addr) + webhookProbePath
	return healthz.NamedCheck("webhook-serving", func(r *http.Request) error {
		ctx, cancel := context.WithTimeout(r.Context(), webhookProbeTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("webhook listener: %w", err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("webhook listener answered %s", resp.Status)
		}
		return nil
	})
}

// loopback is addr as this process can reach it: a listener on all
// interfaces is reached over the loopback interface.
func loopback(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return addr.String()
	}
	ip := net.IPv4(127, 0, 0, 1)
	if tcp.IP.To4() == nil {
		ip = net.IPv6loopback
	}
	return net.JoinHostPort(ip.String(), fmt.Sprint(tcp.Port))
}
