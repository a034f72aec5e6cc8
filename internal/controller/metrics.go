package controller

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/student-controller/student-controller/internal/registry"
)

// Metrics are the controller's Prometheus metrics. Create them once per process with
// NewMetrics; a Controller without them records nothing.
type Metrics struct {
	reconcileTotal    *prometheus.CounterVec
	reconcileDuration *prometheus.HistogramVec
	registryDuration  *prometheus.HistogramVec
	rowsWritten       *prometheus.CounterVec
	sweepTotal        *prometheus.CounterVec
	sweepDuration     prometheus.Histogram
	sweepDeleted      prometheus.Counter
	malformedRows     prometheus.Gauge
	notReady          prometheus.Gauge

	// notReadyKeys are the Students whose last sync left them not Ready: only those,
	// so that the set costs nothing while all is well.
	mu           sync.Mutex
	notReadyKeys map[string]struct{}
}

// Results of a reconcile, the label of the reconcile metrics.
const (
	resultSuccess  = "success"
	resultError    = "error"
	resultConflict = "conflict"
	resultTerminal = "terminal"
	// resultNotLeading: refused before it started, by Config.Leading (retried).
	resultNotLeading = "not_leading"
)

// NewMetrics creates the controller's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reconcileTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "student_controller_reconcile_total",
			Help: "Syncs of a Student, by result: success, error (retried with backoff), conflict (retried), terminal (not retried), not_leading (refused: this replica cannot know it leads; retried).",
		}, []string{"result"}),
		reconcileDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "student_controller_reconcile_duration_seconds",
			Help:    "Time one sync of a Student took, by result.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"result"}),
		registryDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "student_controller_registry_operation_duration_seconds",
			Help:    "Latency of registry operations, by operation (get, upsert, delete, release, relinquish, record_policy, bind, list) and result (ok, not_found, not_owned, malformed, error).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}, []string{"operation", "result"}),
		rowsWritten: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "student_controller_registry_rows_written_total",
			Help: "Registry rows written by syncs, by action: created (a new Student's first row), updated (spec changed, or the row was changed or unreadable), restored (the row had gone missing), deleted and released (the Student was deleted).",
		}, []string{"action"}),
		sweepTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "student_controller_sweep_total",
			Help: "Registry sweeps, by outcome: clean, repaired (rows queued for repair or orphans deleted), refused (mass deletion past the bound), error.",
		}, []string{"outcome"}),
		sweepDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "student_controller_sweep_duration_seconds",
			Help:    "Time one registry sweep took: listing the owned rows, comparing them with the cache, deleting orphans.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}),
		sweepDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "student_controller_sweep_deleted_rows_total",
			Help: "Orphan registry rows deleted by sweeps.",
		}),
		malformedRows: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "student_controller_registry_malformed_rows",
			Help: "Rows this controller owns that the last sweep could not read and skipped (written past the schema's checks).",
		}),
		notReady: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "student_controller_students_not_ready",
			Help: "Students whose last sync left them not Ready (invalid spec, registry error, row owned elsewhere); deleted Students are not counted.",
		}),
		notReadyKeys: map[string]struct{}{},
	}
	if reg != nil {
		reg.MustRegister(m.reconcileTotal, m.reconcileDuration, m.registryDuration, m.rowsWritten, m.sweepTotal, m.sweepDuration, m.sweepDeleted, m.malformedRows, m.notReady)
	}
	return m
}

func (m *Metrics) observeSync(result string, took time.Duration) {
	if m == nil {
		return
	}
	m.reconcileTotal.WithLabelValues(result).Inc()
	m.reconcileDuration.WithLabelValues(result).Observe(took.Seconds())
}

// observeReady records whether the Student of key is Ready after its sync.
func (m *Metrics) observeReady(key string, ready bool) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ready {
		delete(m.notReadyKeys, key)
	} else {
		m.notReadyKeys[key] = struct{}{}
	}
	m.notReady.Set(float64(len(m.notReadyKeys)))
}

// forget drops a Student that is gone or being deleted from the not-Ready count.
func (m *Metrics) forget(key string) { m.observeReady(key, true) }

// Actions on registry rows, the label of the rows-written metric.
const (
	rowCreated  = "created"
	rowUpdated  = "updated"
	rowRestored = "restored"
	rowDeleted  = "deleted"
	rowReleased = "released"
)

func (m *Metrics) observeRow(action string) {
	if m == nil {
		return
	}
	m.rowsWritten.WithLabelValues(action).Inc()
}

func (m *Metrics) observeSweep(r SweepResult, err error, took time.Duration) {
	if m == nil {
		return
	}
	m.sweepDuration.Observe(took.Seconds())
	outcome := "clean"
	switch {
	case err != nil:
		outcome = "error"
	case r.Refused:
		outcome = "refused"
	case r.Resync > 0 || r.Deleted > 0:
		outcome = "repaired"
	}
	m.sweepTotal.WithLabelValues(outcome).Inc()
	m.sweepDeleted.Add(float64(r.Deleted))
	if err == nil {
		m.malformedRows.Set(float64(r.Malformed))
	}
}

// timedRegistry records the latency and result of every registry operation.
type timedRegistry struct {
	Registry
	m *Metrics
}

func (t timedRegistry) observe(op string, start time.Time, err error) {
	result := "ok"
	switch {
	case errors.Is(err, registry.ErrNotFound):
		result = "not_found"
	case errors.Is(err, registry.ErrNotOwned):
		result = "not_owned"
	case errors.Is(err, registry.ErrMalformed):
		result = "malformed"
	case err != nil:
		result = "error"
	}
	t.m.registryDuration.WithLabelValues(op, result).Observe(time.Since(start).Seconds())
}

func (t timedRegistry) Get(ctx context.Context, uid string) (registry.Record, error) {
	start := time.Now()
	rec, err := t.Registry.Get(ctx, uid)
	t.observe("get", start, err)
	return rec, err
}

func (t timedRegistry) Upsert(ctx context.Context, rec registry.Record) (registry.Record, error) {
	start := time.Now()
	out, err := t.Registry.Upsert(ctx, rec)
	t.observe("upsert", start, err)
	return out, err
}

func (t timedRegistry) Delete(ctx context.Context, uid, owner string) (bool, error) {
	start := time.Now()
	done, err := t.Registry.Delete(ctx, uid, owner)
	t.observe("delete", start, err)
	return done, err
}

func (t timedRegistry) Release(ctx context.Context, rec registry.Record) (bool, error) {
	start := time.Now()
	done, err := t.Registry.Release(ctx, rec)
	t.observe("release", start, err)
	return done, err
}

func (t timedRegistry) Relinquish(ctx context.Context, uid, owner string) (registry.Outcome, error) {
	start := time.Now()
	outcome, err := t.Registry.Relinquish(ctx, uid, owner)
	t.observe("relinquish", start, err)
	return outcome, err
}

func (t timedRegistry) RecordPolicy(ctx context.Context, uid, owner, policy string) error {
	start := time.Now()
	err := t.Registry.RecordPolicy(ctx, uid, owner, policy)
	t.observe("record_policy", start, err)
	return err
}

func (t timedRegistry) Bind(ctx context.Context, owner, cluster string) (registry.Binding, error) {
	start := time.Now()
	b, err := t.Registry.Bind(ctx, owner, cluster)
	t.observe("bind", start, err)
	return b, err
}

func (t timedRegistry) List(ctx context.Context, owner string) ([]registry.Record, []registry.MalformedRow, error) {
	start := time.Now()
	rows, malformed, err := t.Registry.List(ctx, owner)
	t.observe("list", start, err)
	return rows, malformed, err
}
