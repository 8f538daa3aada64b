package telemetry

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Auth guards the metrics server the way every delegated-auth component
// (kube-rbac-proxy, controller-runtime's metrics filter, kube-state-metrics)
// does: the caller's bearer token is checked with a TokenReview, and what it
// may do with a SubjectAccessReview on the non-resource URL it asks for
// (e.g. get /metrics), both answered by the API server.
type Auth struct {
	Authenticator authenticator.Request
	Authorizer    authorizer.Authorizer
}

// Cache lifetimes of the delegated decisions: a scrape every 15-60 s costs
// the API server one review a minute per caller; a revoked binding takes
// effect within a minute, a denial is retried after 10 s. Token reviews
// are cached for a minute.
const (
	tokenCacheTTL = time.Minute
	allowCacheTTL = time.Minute
	denyCacheTTL  = 10 * time.Second
	reviewTimeout = 10 * time.Second
)

// reviewBackoff is k8s.io/apiserver/pkg/server/options'
// DefaultAuthWebhookRetryBackoff, without importing the server options.
var reviewBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// DelegatedAuth returns an Auth that asks the API server behind client,
// with anonymous requests refused and both answers cached briefly.
func DelegatedAuth(client kubernetes.Interface) (*Auth, error) {
	backoff := reviewBackoff
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:  client.AuthenticationV1(),
		TokenAccessReviewTimeout: reviewTimeout,
		WebhookRetryBackoff:      &backoff,
		CacheTTL:                 tokenCacheTTL,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("delegated authentication (TokenReview): %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: client.AuthorizationV1(),
		AllowCacheTTL:             allowCacheTTL,
		DenyCacheTTL:              denyCacheTTL,
		WebhookRetryBackoff:       &backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("delegated authorization (SubjectAccessReview): %w", err)
	}
	return &Auth{Authenticator: authn, Authorizer: authz}, nil
}

// Wrap returns h behind a: 401 without a valid token, 403 unless the
// token's user may use the request's verb (the lower-case HTTP method, as
// the API server names verbs on non-resource URLs: get, post) on its path.
func (a *Auth) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		logger := klog.FromContext(r.Context())
		res, ok, err := a.Authenticator.AuthenticateRequest(r)
		if err != nil || !ok {
			logger.V(4).Info("Unauthenticated metrics request", "path", r.URL.Path, "remote", r.RemoteAddr, "err", err)
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		attrs := authorizer.AttributesRecord{
			User:            res.User,
			Verb:            strings.ToLower(r.Method),
			Path:            r.URL.Path,
			ResourceRequest: false,
		}
		decision, reason, err := a.Authorizer.Authorize(r.Context(), attrs)
		if err != nil {
			logger.Error(err, "Authorize metrics request", "user", res.User.GetName(), "verb", attrs.Verb, "path", attrs.Path)
			http.Error(w, "Authorization failed", http.StatusInternalServerError)
			return
		}
		if decision != authorizer.DecisionAllow {
			logger.V(4).Info("Forbidden metrics request", "user", res.User.GetName(), "verb", attrs.Verb, "path", attrs.Path, "reason", reason)
			http.Error(w, fmt.Sprintf("Forbidden: user %q may not %s %s", res.User.GetName(), attrs.Verb, attrs.Path), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}
