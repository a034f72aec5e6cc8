// Package metricsauth guards an HTTP endpoint so that only callers whom the Kubernetes
// API server authenticates (TokenReview) and authorizes (SubjectAccessReview, the
// request's verb on its URL path) reach it: what kube-rbac-proxy and controller-runtime's
// metrics filter do, over client-go alone.
package metricsauth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Decisions are cached briefly, so that a scraper every few seconds costs the API
// server two requests a minute rather than two a scrape; a denial is forgotten sooner.
const (
	allowTTL  = time.Minute
	denyTTL   = 10 * time.Second
	maxCached = 1024
)

// Filter checks callers against the API server.
type Filter struct {
	client kubernetes.Interface
	now    func() time.Time

	mu sync.Mutex
	// Allowed and refused decisions apart: anyone can send forged tokens, which fill
	// and empty only the refusals, never the decisions of callers who may scrape.
	allowed, refused map[string]decision
}

type decision struct {
	status  int // http.StatusOK to let the request through
	expires time.Time
}

// New returns a Filter that asks the API server through client.
func New(client kubernetes.Interface) *Filter {
	return &Filter{client: client, now: time.Now, allowed: map[string]decision{}, refused: map[string]decision{}}
}

// Wrap lets through to next only the requests that the API server allows.
func (f *Filter) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			http.Error(w, "Unauthorized: a bearer token is required", http.StatusUnauthorized)
			return
		}
		verb := strings.ToLower(r.Method)
		sum := sha256.Sum256([]byte(token))
		key := hex.EncodeToString(sum[:]) + " " + verb + " " + r.URL.Path

		status, cached := f.cached(key)
		if !cached {
			status = f.decide(r.Context(), token, verb, r.URL.Path)
			f.remember(key, status)
		}
		switch status {
		case http.StatusOK:
			next.ServeHTTP(w, r)
		case http.StatusUnauthorized:
			http.Error(w, "Unauthorized", status)
		case http.StatusForbidden:
			http.Error(w, "Forbidden: "+verb+" on "+r.URL.Path+" is not allowed", status)
		default:
			http.Error(w, "Cannot check the caller with the API server", status)
		}
	})
}

// decide asks the API server who the caller is and whether they may make the request.
func (f *Filter) decide(ctx context.Context, token, verb, path string) int {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	review, err := f.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token},
	}, metav1.CreateOptions{})
	if err != nil {
		klog.FromContext(ctx).Error(err, "TokenReview failed")
		return http.StatusServiceUnavailable
	}
	if !review.Status.Authenticated {
		return http.StatusUnauthorized
	}
	user := review.Status.User
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := f.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		klog.FromContext(ctx).Error(err, "SubjectAccessReview failed")
		return http.StatusServiceUnavailable
	}
	if !sar.Status.Allowed {
		return http.StatusForbidden
	}
	return http.StatusOK
}

func (f *Filter) cached(key string) (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	// A refusal first: a caller allowed a while ago may have lost its rights since.
	for _, cache := range []map[string]decision{f.refused, f.allowed} {
		if d, ok := cache[key]; ok && !now.After(d.expires) {
			return d.status, true
		}
	}
	return 0, false
}

func (f *Filter) remember(key string, status int) {
	ttl, cache := denyTTL, f.refused
	switch status {
	case http.StatusOK:
		ttl, cache = allowTTL, f.allowed
	case http.StatusUnauthorized, http.StatusForbidden:
	default:
		return // the API server failed: ask again next time
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(cache) >= maxCached {
		clear(cache)
	}
	cache[key] = decision{status: status, expires: f.now().Add(ttl)}
}
