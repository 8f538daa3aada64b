package telemetry

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics"
)

const (
	promToken  = "prom-token"
	otherToken = "other-token"
	promUser   = "system:serviceaccount:monitoring:prometheus"
)

// fakeAuth accepts promToken as promUser and otherToken as "intruder"; it
// lets promUser get /metrics and nothing else.
var fakeAuth = &Auth{
	Authenticator: authenticator.RequestFunc(func(r *http.Request) (*authenticator.Response, bool, error) {
		switch r.Header.Get("Authorization") {
		case "Bearer " + promToken:
			return &authenticator.Response{User: &user.DefaultInfo{Name: promUser}}, true, nil
		case "Bearer " + otherToken:
			return &authenticator.Response{User: &user.DefaultInfo{Name: "intruder"}}, true, nil
		}
		return nil, false, nil
	}),
	Authorizer: authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
		if a.GetUser().GetName() == promUser && a.GetVerb() == "get" && a.GetPath() == MetricsPath && !a.IsResourceRequest() {
			return authorizer.DecisionAllow, "", nil
		}
		return authorizer.DecisionNoOpinion, "not bound", nil
	}),
}

type authCase struct {
	method, path, token string
	want                int
}

var authCases = map[string]authCase{
	"no token":                 {http.MethodGet, MetricsPath, "", http.StatusUnauthorized},
	"invalid token":            {http.MethodGet, MetricsPath, "forged", http.StatusUnauthorized},
	"subject not allowed":      {http.MethodGet, MetricsPath, otherToken, http.StatusForbidden},
	"allowed":                  {http.MethodGet, MetricsPath, promToken, http.StatusOK},
	"other path, other verb":   {http.MethodPost, "/simulate/event", promToken, http.StatusForbidden},
	"extra path without token": {http.MethodPost, "/simulate/event", "", http.StatusUnauthorized},
}

// TestServeDelegatedAuth: with Auth, Serve answers HTTPS only (with a
// self-signed certificate) and serves the metrics, and the extra paths,
// only to a token whose user may use them.
func TestServeDelegatedAuth(t *testing.T) {
	m := NewDriverMetrics("node-a")
	injected := false
	extra := map[string]http.Handler{"/simulate/event": http.HandlerFunc(func(http.ResponseWriter, *http.Request) { injected = true })}
	addr := serveForTest(t, NewRegistry(m, nil), extra, Security{Auth: fakeAuth})
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}

	for name, c := range authCases {
		t.Run(name, func(t *testing.T) {
			status, body := request(t, client, c.method, "https://"+addr+c.path, c.token)
			if status != c.want {
				t.Fatalf("%s %s: status %d, want %d (%s)", c.method, c.path, status, c.want, body)
			}
			if c.want == http.StatusOK && !strings.Contains(body, "gpu_dra_plugin_mig_instances") {
				t.Errorf("allowed scrape lacks the driver's metrics:\n%s", body)
			}
			if c.want != http.StatusOK && strings.Contains(body, "gpu_dra_") {
				t.Errorf("refused request got metrics:\n%s", body)
			}
		})
	}
	if injected {
		t.Error("a refused POST /simulate/event reached its handler")
	}
	if resp, err := client.Get("http://" + addr + MetricsPath); err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP scrape of the authenticated server succeeded")
		}
	}
}

// TestServeTLSFlags: a certificate without its key is refused up front.
func TestServeTLSFlags(t *testing.T) {
	err := Serve(context.Background(), "127.0.0.1:0", NewRegistry(nil, nil), nil, Security{CertFile: "tls.crt"})
	if err == nil || !strings.Contains(err.Error(), "key file") {
		t.Fatalf("Serve with a certificate file and no key file: %v, want an error naming the key file", err)
	}
	err = Serve(context.Background(), "127.0.0.1:0", NewRegistry(nil, nil), nil, Security{CertFile: "/nonexistent/tls.crt", KeyFile: "/nonexistent/tls.key"})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/tls.crt") {
		t.Fatalf("Serve with missing certificate files: %v, want an error naming them", err)
	}
}

// TestDelegatedAuth: DelegatedAuth asks the API server with a TokenReview
// and a SubjectAccessReview for get on the non-resource URL /metrics, and
// caches both answers.
func TestDelegatedAuth(t *testing.T) {
	// The delegating factories post through the clientset's RESTClient,
	// which a fake clientset lacks: answer the reviews over HTTP instead.
	var tokenReviews, accessReviews atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var out any
		switch r.URL.Path {
		case "/apis/authentication.k8s.io/v1/tokenreviews":
			tokenReviews.Add(1)
			var tr authenticationv1.TokenReview
			if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			switch tr.Spec.Token {
			case promToken:
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: promUser}}
			case otherToken:
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "intruder"}}
			default:
				tr.Status = authenticationv1.TokenReviewStatus{Error: "invalid token"}
			}
			out = &tr
		case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
			accessReviews.Add(1)
			var sar authorizationv1.SubjectAccessReview
			if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			nr := sar.Spec.NonResourceAttributes
			sar.Status.Allowed = sar.Spec.User == promUser && sar.Spec.ResourceAttributes == nil && nr != nil && nr.Verb == "get" && nr.Path == MetricsPath
			out = &sar
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	}))
	defer api.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := DelegatedAuth(client)
	if err != nil {
		t.Fatal(err)
	}
	h := auth.Wrap(Handler(NewRegistry(NewDriverMetrics(""), nil)))
	for name, c := range authCases {
		t.Run(name, func(t *testing.T) {
			req := httptest.NewRequest(c.method, c.path, nil)
			if c.token != "" {
				req.Header.Set("Authorization", "Bearer "+c.token)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != c.want {
				t.Fatalf("%s %s: status %d, want %d (%s)", c.method, c.path, rec.Code, c.want, rec.Body)
			}
		})
	}
	tr, sar := tokenReviews.Load(), accessReviews.Load()
	if tr == 0 || sar == 0 {
		t.Fatalf("TokenReviews %d, SubjectAccessReviews %d: the API server was not asked", tr, sar)
	}
	for range 3 {
		req := httptest.NewRequest(http.MethodGet, MetricsPath, nil)
		req.Header.Set("Authorization", "Bearer "+promToken)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("repeated scrape: status %d", rec.Code)
		}
	}
	if tokenReviews.Load() != tr || accessReviews.Load() != sar {
		t.Errorf("repeated scrapes asked the API server again (TokenReviews %d→%d, SubjectAccessReviews %d→%d): answers not cached",
			tr, tokenReviews.Load(), sar, accessReviews.Load())
	}
}

// serveForTest runs Serve on a free local port until the test ends and
// returns its address once it accepts connections.
func serveForTest(t *testing.T, reg metrics.KubeRegistry, extra map[string]http.Handler, sec Security) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errCh := make(chan error, 1)
	go func() { errCh <- Serve(ctx, addr, reg, extra, sec) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errCh; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if conn, err := net.Dial("tcp", addr); err == nil {
			_ = conn.Close()
			return addr
		}
	}
	t.Fatalf("Serve did not listen on %s", addr)
	return ""
}

func request(t *testing.T, client *http.Client, method, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}
