package controller

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricsStartAtZero: each result, row action and sweep outcome is exported at 0
// from the start, so that the first failure of a new Pod is an increase that the
// alerts' increase() and rate() can see (a series that appears at 1 has none).
func TestMetricsStartAtZero(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	tests := []struct {
		name   string
		vec    *prometheus.CounterVec
		values []string
	}{
		{"reconcile_total", m.reconcileTotal, []string{"success", "error", "conflict", "terminal", "not_leading"}},
		{"registry_rows_written_total", m.rowsWritten, []string{"created", "updated", "restored", "deleted", "released"}},
		{"sweep_total", m.sweepTotal, []string{"clean", "repaired", "refused", "error"}},
	}
	for _, tc := range tests {
		// Counted before WithLabelValues below creates what is missing.
		if n := testutil.CollectAndCount(tc.vec); n != len(tc.values) {
			t.Errorf("%s: %d series exported before anything was counted, want %d (%v)", tc.name, n, len(tc.values), tc.values)
		}
		for _, v := range tc.values {
			if got := testutil.ToFloat64(tc.vec.WithLabelValues(v)); got != 0 {
				t.Errorf("%s{%q} = %v, want 0", tc.name, v, got)
			}
		}
	}
}
