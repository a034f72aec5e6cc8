package controller

import (
	"context"
	"errors"
	"go.opentelemetry.io/otel/trace"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/student-controller/student-controller/internal/registry"
)

// Metrics are the controller's Prometheus metrics: create them once per process with
// NewMetrics.
type Metrics struct {
	reconcileTotal    *prometheus.CounterVec
	reconcileDuration *prometheus.HistogramVec
	registryDuration  *prometheus.HistogramVec
	rowsWritten       *prometheus.CounterVec
	sweepTotal        *prometheus.CounterVec
	sweepDuration     prometheus.Histogram
	releasedAbsent    prometheus.Counter
	rewritesRefused   prometheus.Counter
	registryBehind    prometheus.Gauge
	undone            *prometheus.CounterVec
	malformedRows     prometheus.Gauge
	registryAhead     prometheus.Counter
	notReady          prometheus.GaugeFunc
	drifted           prometheus.GaugeFunc
	paused            prometheus.GaugeFunc
	pausedOldest      prometheus.GaugeFunc
	plannedActions    *prometheus.GaugeVec
	fenceHeld         prometheus.Gauge
	fenceWaiting      prometheus.Gauge
	syncLatency       prometheus.Histogram

	// states are the controller's; the Student gauges read them.
	states atomic.Pointer[states]
}

// Results of a reconcile, the label of the reconcile metrics.
const (
	resultSuccess    = "success"
	resultError      = "error"
	resultConflict   = "conflict"
	resultTerminal   = "terminal"
	resultNotLeading = "not_leading" // refused before it started, by Config.Leading (retried)
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
			Help:    "Latency of registry operations, by operation (get, insert, upsert, rewind, take_back, delete, release, relinquish, record_policy, mark_observed, adopt, bind, list, prune_history) and result (ok, not_found, not_owned, malformed, exists, error).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}, []string{"operation", "result"}),
		rowsWritten: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "student_controller_registry_rows_written_total",
			Help: "Registry rows written by syncs, by action: created (a new Student's first row), updated (spec changed, or the row was changed or unreadable), restored (the row had gone missing), deleted and released (the Student was deleted).",
		}, []string{"action"}),
		sweepTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "student_controller_sweep_total",
			Help: "Registry sweeps, by outcome: clean, repaired (rows queued for repair or orphans released), refused (orphans past the bound, or while the registry is behind the cluster's mark: none released), error.",
		}, []string{"outcome"}),
		sweepDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "student_controller_sweep_duration_seconds",
			Help:    "Time one registry sweep took: listing the owned rows, comparing them with the cache, releasing orphans.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}),
		releasedAbsent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "student_controller_registry_rows_released_without_student_total",
			Help: "Owned registry rows released because their Student was not found (by a sweep, or a sync whose cache was behind), kept with the deletion policy they record: absence never deletes a row. student-controller registry prune deletes those whose policy is Delete, when asked.",
		}),
		undone: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "student_controller_registry_rows_undone_total",
			Help: "Rows of production's past this controller undid, within --registry-max-rewinds, by action: taken_back (a row this owner released, for a Student of its uid that is live again) and recreated (a row its Student's finalizer deleted, written again for that Student, live again): the cluster went back in time, or is a clone. Rows ahead rewound are student_controller_registry_rows_ahead_total.",
		}, []string{"action"}),
		rewritesRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "student_controller_registry_rewrites_refused_total",
			Help: "Rows this controller did not take back, rewind or write again because it had undone as many as --registry-max-rewinds allows since it started; their Students are Ready=False and say why.",
		}),
		registryBehind: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "student_controller_registry_behind",
			Help: "1 while the registry's mark is below the one this cluster has seen (the registry went back in time: an older backup put back, a point-in-time recovery, a failover to a standby that lagged) and no operator has confirmed it: the sweep releases nothing and prune refuses. 0 otherwise.",
		}),
		malformedRows: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "student_controller_registry_malformed_rows",
			Help: "Rows this controller owns that the last sweep could not read and skipped (written past the schema's checks).",
		}),
		registryAhead: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "student_controller_registry_rows_ahead_total",
			Help: "Registry rows found at a newer generation than their Student on the API server (the cluster went back in time, as after an etcd restore) and written to follow the Student again.",
		}),
		plannedActions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "student_controller_dry_run_planned_actions",
			Help: "With --dry-run: what the last plan lists, by action (add-finalizer, create, update, restore, delete, release, finalize, refuse, drifted), as student-controller plan does; nothing is done.",
		}, []string{"action"}),
		fenceHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "student_controller_registry_fence_held",
			Help: "1 while this controller holds its owner's write fence in the registry (it may write), else 0.",
		}),
		fenceWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "student_controller_registry_fence_waiting",
			Help: "1 while another live controller of the same owner (a clone of the cluster, a second install, a laptop) holds the owner's write fence and this one waits to write, else 0.",
		}),
		syncLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "student_controller_sync_latency_seconds",
			Help:    "Time from the watch event that brings a Student's new generation (a create, a spec change) to its registry row written and its status reported Ready at that generation: what a user waits for. A newer generation that arrives first restarts the clock; paused and deleted Students are not timed.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60},
		}),
	}
	m.notReady = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "student_controller_students_not_ready",
		Help: "Students whose last sync left them not Ready (invalid spec, registry error, row owned elsewhere); deleted Students, and observed Students whose row drifted (student_controller_students_drifted), are not counted.",
	}, func() float64 { n, _, _, _ := m.counts(); return float64(n) })
	m.drifted = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "student_controller_students_drifted",
		Help: "Observed Students (spec.management: Observe) whose registry row differs from their spec, as their last sync found it; the controller does not write them.",
	}, func() float64 { _, n, _, _ := m.counts(); return float64(n) })
	m.paused = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "student_controller_students_paused",
		Help: "Students that the annotation bolingcavalry.k8s.io/paused holds still: nothing is written for them.",
	}, func() float64 { _, _, n, _ := m.counts(); return float64(n) })
	m.pausedOldest = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "student_controller_students_paused_oldest_timestamp_seconds",
		Help: "When the Student paused longest was paused (its Synced condition's lastTransitionTime), in seconds since the epoch; 0 when none is paused.",
	}, func() float64 {
		if _, _, _, oldest := m.counts(); !oldest.IsZero() {
			return float64(oldest.Unix())
		}
		return 0
	})
	// Every label value starts at 0, so a failure after the first scrape is an increase:
	// increase() and rate() need two samples. One counted earlier starts its series at 1.
	for _, result := range []string{resultSuccess, resultError, resultConflict, resultTerminal, resultNotLeading} {
		m.reconcileTotal.WithLabelValues(result)
	}
	for _, action := range []string{rowCreated, rowUpdated, rowRestored, rowDeleted, rowReleased} {
		m.rowsWritten.WithLabelValues(action)
	}
	for _, action := range []string{undoneTakenBack, undoneRecreated} {
		m.undone.WithLabelValues(action)
	}
	for _, outcome := range []string{sweepClean, sweepRepaired, sweepRefused, sweepError} {
		m.sweepTotal.WithLabelValues(outcome)
	}
	if reg != nil {
		reg.MustRegister(m.reconcileTotal, m.reconcileDuration, m.registryDuration, m.rowsWritten, m.sweepTotal, m.sweepDuration,
			m.releasedAbsent, m.rewritesRefused, m.registryBehind, m.undone, m.malformedRows, m.registryAhead, m.notReady, m.drifted, m.paused, m.pausedOldest, m.plannedActions,
			m.fenceHeld, m.fenceWaiting, m.syncLatency)
	}
	return m
}

// ObserveFence records whether this controller holds, or waits for, its owner's fence.
func (m *Metrics) ObserveFence(held, waiting bool) {
	m.fenceHeld.Set(b2f(held))
	m.fenceWaiting.Set(b2f(waiting))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// The actions of student_controller_registry_rows_undone_total.
const (
	undoneTakenBack = "taken_back"
	undoneRecreated = "recreated"
)

// SetRegistryBehind says whether the registry is behind the cluster's mark.
func (m *Metrics) SetRegistryBehind(behind bool) { m.registryBehind.Set(b2f(behind)) }

func (m *Metrics) observeSync(result string, took time.Duration) {
	m.reconcileTotal.WithLabelValues(result).Inc()
	m.reconcileDuration.WithLabelValues(result).Observe(took.Seconds())
}

// counts are the states' counts (states.counts), zero before a controller is made.
func (m *Metrics) counts() (notReady, drifted, paused int, oldest time.Time) {
	if st := m.states.Load(); st != nil {
		return st.counts()
	}
	return 0, 0, 0, time.Time{}
}

// observePlan records a dry run's plan: the count of each action, 0 included.
func (m *Metrics) observePlan(p Plan) {
	counts := map[string]int{}
	for _, a := range p.Actions {
		counts[a.Action]++
	}
	for _, action := range []string{PlanAddFinalizer, PlanCreate, PlanUpdate, PlanRestore, PlanDelete, PlanRelease, PlanFinalize, PlanRefuse, PlanDrifted} {
		m.plannedActions.WithLabelValues(action).Set(float64(counts[action]))
	}
}

// Actions on registry rows, the label of the rows-written metric.
const (
	rowCreated  = registry.ActionCreated
	rowUpdated  = registry.ActionUpdated
	rowRestored = registry.ActionRestored
	rowDeleted  = registry.ActionDeleted
	rowReleased = registry.ActionReleased
)

// Outcomes of a sweep, the label of the sweep metric.
const (
	sweepClean    = "clean"
	sweepRepaired = "repaired" // rows queued for repair or orphans released
	sweepRefused  = "refused"  // orphans past the bound, or the registry behind
	sweepError    = "error"
)

func (m *Metrics) observeSweep(r SweepResult, err error, took time.Duration) {
	m.sweepDuration.Observe(took.Seconds())
	outcome := sweepClean
	switch {
	case err != nil:
		outcome = sweepError
	case r.Refused:
		outcome = sweepRefused
	case r.Resync > 0 || r.Released > 0:
		outcome = sweepRepaired
	}
	m.sweepTotal.WithLabelValues(outcome).Inc()
	if err == nil {
		m.malformedRows.Set(float64(r.Malformed))
	}
}

// timedRegistry records the latency and result of every registry operation, and
// traces it as a child span of the sync or sweep that called it (with Config.Tracer).
type timedRegistry struct {
	Registry
	m      *Metrics
	tracer trace.Tracer
}

type registryOp struct {
	t     timedRegistry
	name  string
	start time.Time
	span  trace.Span
}

// start starts operation op; end it with its error.
func (t timedRegistry) start(ctx context.Context, op string) (context.Context, registryOp) {
	r := registryOp{t: t, name: op, start: time.Now(), span: noopSpan}
	if t.tracer != nil { // the span's name is made only then
		ctx, r.span = t.tracer.Start(ctx, spanRegistry+op)
	}
	return ctx, r
}

func (r registryOp) end(err error) {
	endSpan(r.span, err)
	if r.t.m == nil {
		return // tests of the span alone
	}
	result := "ok"
	switch {
	case errors.Is(err, registry.ErrNotFound):
		result = "not_found"
	case errors.Is(err, registry.ErrNotOwned):
		result = "not_owned"
	case errors.Is(err, registry.ErrMalformed):
		result = "malformed"
	case errors.Is(err, registry.ErrExists):
		result = "exists"
	case err != nil:
		result = "error"
	}
	r.t.m.registryDuration.WithLabelValues(r.name, result).Observe(time.Since(r.start).Seconds())
}

func (t timedRegistry) Get(ctx context.Context, uid string) (registry.Record, error) {
	ctx, op := t.start(ctx, "get")
	rec, err := t.Registry.Get(ctx, uid)
	op.end(err)
	return rec, err
}

func (t timedRegistry) Apply(ctx context.Context, o registry.Op) (registry.Result, error) {
	ctx, op := t.start(ctx, o.Kind.String())
	out, err := t.Registry.Apply(ctx, o)
	op.end(err)
	return out, err
}

func (t timedRegistry) List(ctx context.Context, owner string) ([]registry.Record, []registry.MalformedRow, error) {
	ctx, op := t.start(ctx, "list")
	rows, malformed, err := t.Registry.List(ctx, owner)
	op.end(err)
	return rows, malformed, err
}
