package main

import (
	"fmt"
	"net/http"
	"net/http/pprof"

	"k8s.io/client-go/tools/leaderelection"
)

// probeHandler serves /healthz (the process works: with leader election, a leader
// that can no longer renew its Lease is not healthy) and /readyz (the Student cache
// has synced). Readiness does not ask the registry: during a database outage every
// replica would be unready at once, and the PodDisruptionBudget would then block every
// node drain; the outage shows in the Students' conditions, the metrics and alerts.
// pprof's cmdline is not served: the command line may hold a registry URL.
func probeHandler(synced func() bool, watchdog *leaderelection.HealthzAdaptor) http.Handler {
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
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// pprofHandler serves Go's profiles under /debug/pprof/, for --pprof-bind-address.
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
