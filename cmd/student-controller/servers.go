package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/klog/v2"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/student-controller/student-controller/internal/metricsauth"
)

// serveMetrics serves /metrics over HTTP, or HTTPS with API-server auth
// (--metrics-secure), unless its address is 0.
func serveMetrics(ctx context.Context, wg *sync.WaitGroup, opts options, cfg *rest.Config) error {
	if opts.metricsAddr == "0" {
		return nil
	}
	mo := metricsserver.Options{BindAddress: opts.metricsAddr, SecureServing: opts.metricsSecure,
		// No gzip: it keeps a compressor alive between scrapes (bench/results/history.md).
		HandlerOpts: []func(*promhttp.HandlerOpts){func(o *promhttp.HandlerOpts) { o.DisableCompression = true }},
	}
	if opts.metricsSecure {
		mo.FilterProvider = func(c *rest.Config, hc *http.Client) (metricsserver.Filter, error) {
			client, err := kubernetes.NewForConfigAndClient(c, hc)
			if err != nil {
				return nil, err
			}
			filter := metricsauth.New(client)
			return func(_ logr.Logger, h http.Handler) (http.Handler, error) { return filter.Wrap(h), nil }, nil
		}
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return fmt.Errorf("metrics server client: %w", err)
	}
	srv, err := metricsserver.NewServer(mo, cfg, httpClient)
	if err != nil {
		return fmt.Errorf("metrics server: %w", err)
	}
	wg.Go(func() {
		if err := srv.Start(ctx); err != nil {
			utilruntime.HandleErrorWithContext(ctx, err, "Metrics server stopped")
		}
	})
	return nil
}

// listenAndServe serves h at addr (not 0) until ctx ends, bound now: a taken port fails.
func listenAndServe(ctx context.Context, wg *sync.WaitGroup, addr string, h http.Handler, what string) error {
	if addr == "0" {
		return nil
	}
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	klog.FromContext(ctx).Info("Serving", "what", what, "address", ln.Addr().String())
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			utilruntime.HandleErrorWithContext(ctx, err, "Server stopped", "what", what)
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	})
	return nil
}

// probeHandler serves /healthz (failing for a leader that cannot renew) and /readyz (the
// Student cache has synced). Readiness skips the registry: in its outage all replicas
// would be unready at once, and the PDB would block node drains.
func probeHandler(ready func() error, watchdog *leaderelection.HealthzAdaptor) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if watchdog != nil {
			if err := watchdog.Check(r); err != nil {
				http.Error(w, "leader election: "+err.Error(), http.StatusInternalServerError)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// pprofHandler serves Go's profiles, but not cmdline: it may hold a registry URL.
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
