package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/pprof"
	"time"

	"k8s.io/client-go/tools/leaderelection"
)

// probeHandler serves /healthz (the process works: with leader election, a leader
// that can no longer renew its Lease is not healthy) and /readyz (the Student cache
// has synced and the registry answers).
func probeHandler(synced func() bool, pingRegistry func(context.Context) error, watchdog *leaderelection.HealthzAdaptor) http.Handler {
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
		if !synced() {
			http.Error(w, "not ready: the Student cache has not synced", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := pingRegistry(ctx); err != nil {
			http.Error(w, "not ready: the registry does not answer: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// pprofHandler serves Go's profiles under /debug/pprof/, for --pprof-bind-address.
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
