package metricsauth

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// apiServer answers TokenReviews (the token "reader" is user reader, "stranger" user
// stranger, anything else unknown) and SubjectAccessReviews (only reader may get
// /metrics) over HTTP, as the API server's two endpoints do, and counts them.
func apiServer(t *testing.T) (kubernetes.Interface, *atomic.Int64) {
	calls := &atomic.Int64{}
	answer := func(w http.ResponseWriter, r *http.Request, obj any, review func()) {
		if r.Method != http.MethodPost {
			http.Error(w, "want POST", http.StatusMethodNotAllowed)
			return
		}
		if err := json.NewDecoder(r.Body).Decode(obj); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		calls.Add(1)
		review()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(obj)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/apis/authentication.k8s.io/v1/tokenreviews", func(w http.ResponseWriter, r *http.Request) {
		tr := &authenticationv1.TokenReview{}
		answer(w, r, tr, func() {
			switch tr.Spec.Token {
			case "reader", "stranger":
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: tr.Spec.Token}}
			}
		})
	})
	mux.HandleFunc("/apis/authorization.k8s.io/v1/subjectaccessreviews", func(w http.ResponseWriter, r *http.Request) {
		sar := &authorizationv1.SubjectAccessReview{}
		answer(w, r, sar, func() {
			attrs := sar.Spec.NonResourceAttributes
			sar.Status.Allowed = sar.Spec.User == "reader" && attrs != nil && attrs.Path == "/metrics" && attrs.Verb == "get"
		})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, QPS: -1, // no client-side rate limit
		ContentConfig: rest.ContentConfig{ContentType: "application/json", AcceptContentTypes: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	return client, calls
}

func TestFilter(t *testing.T) {
	tests := map[string]struct {
		header string
		path   string
		want   int
	}{
		"no token":            {want: http.StatusUnauthorized},
		"not a bearer token":  {header: "Basic abc", want: http.StatusUnauthorized},
		"unknown token":       {header: "Bearer forged", want: http.StatusUnauthorized},
		"not allowed":         {header: "Bearer stranger", want: http.StatusForbidden},
		"allowed":             {header: "Bearer reader", want: http.StatusOK},
		"allowed, other path": {header: "Bearer reader", path: "/debug", want: http.StatusForbidden},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			client, _ := apiServer(t)
			h := New(client).Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
			path := tc.path
			if path == "" {
				path = "/metrics"
			}
			req := httptest.NewRequest(http.MethodGet, path, nil)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.want {
				t.Errorf("status %d, want %d", rec.Code, tc.want)
			}
		})
	}
}

// TestFilterCaches: repeated scrapes do not each cost the API server two requests, and
// a decision is asked again once it expires.
func TestFilterCaches(t *testing.T) {
	client, calls := apiServer(t)
	f := New(client)
	now := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	f.now = func() time.Time { return now }
	h := f.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	for range 5 {
		scrape(h, "reader")
	}
	if calls.Load() != 2 {
		t.Errorf("5 scrapes cost %d API requests, want 2", calls.Load())
	}
	now = now.Add(allowTTL + time.Second)
	scrape(h, "reader")
	if calls.Load() != 4 {
		t.Errorf("after the cache expired: %d API requests, want 4", calls.Load())
	}
}

// TestBogusTokensKeepTheScraper: a burst of forged tokens, more than the cache holds,
// does not evict the scraper's allowed decision (each forged token costs its own
// TokenReview, never the scraper a new one).
func TestBogusTokensKeepTheScraper(t *testing.T) {
	client, calls := apiServer(t)
	h := New(client).Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	scrape(h, "reader")
	for i := range 2 * maxCached {
		scrape(h, fmt.Sprintf("forged-%d", i))
	}
	before := calls.Load()
	scrape(h, "reader")
	if calls.Load() != before {
		t.Errorf("the scraper's next scrape cost %d API requests after a burst of forged tokens, want 0", calls.Load()-before)
	}
}

// TestRevokedCallerCachedAsRefused: a caller allowed once and refused since is cached as
// refused, not asked about again on every scrape.
func TestRevokedCallerCachedAsRefused(t *testing.T) {
	client, calls := apiServer(t)
	f := New(client)
	now := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	f.now = func() time.Time { return now }
	h := f.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	scrape(h, "reader")
	key := ""
	for k := range f.allowed {
		key = k
	}
	// Allowed, expired, and the API server now refuses: remembered as refused.
	f.allowed[key] = decision{status: http.StatusOK, expires: now.Add(-time.Second)}
	f.refused[key] = decision{status: http.StatusForbidden, expires: now.Add(denyTTL)}
	before := calls.Load()
	if code := scrape(h, "reader"); code != http.StatusForbidden || calls.Load() != before {
		t.Errorf("scrape after the refusal: %d with %d API requests, want 403 from the cache", code, calls.Load()-before)
	}
}

// scrape sends GET /metrics with a bearer token through h and returns the status.
func scrape(h http.Handler, token string) int {
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}
