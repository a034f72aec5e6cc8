package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

const (
	// Finalizer holds a Student until its registry row is deleted or released.
	Finalizer = studentv1.FinalizerRegistryRow
	// FieldManager names the controller's writes to the API server.
	FieldManager = "student-controller"
	// Name names the controller in logs, the workqueue and Events.
	Name = "student-controller"
)

// Registry is what the controller needs of the registry: its reads, and Apply for writes.
type Registry interface {
	rowReader
	Apply(ctx context.Context, op registry.Op) (registry.Result, error)
}

// rowReader is the read side of the registry; writes go through writes.
type rowReader interface {
	Get(ctx context.Context, uid string) (registry.Record, error)
	List(ctx context.Context, owner string) ([]registry.Record, []registry.MalformedRow, error)
	// ListReleased returns the rows owner released that nobody has taken since.
	ListReleased(ctx context.Context, owner string) ([]registry.Record, []registry.MalformedRow, error)
	// LastHistory returns the newest history row of a Student, false when none.
	LastHistory(ctx context.Context, namespace, name, uid string) (registry.HistoryEntry, bool, error)
}

// defaultMaxRewinds is Config.MaxRewinds when unset.
const defaultMaxRewinds = 100

// Config tunes a Controller. Owner is required; zero values elsewhere take defaults.
type Config struct {
	// Owner marks the rows this controller writes; it never changes another owner's rows.
	Owner string
	// Cluster, when set, is the kube-system namespace's UID: a sweep first checks that the
	// registry binds Owner to it, and stops the controller if another cluster took over.
	Cluster string
	// Scope is which Students the controller watches (NewWiring sets it). The sweep judges
	// only its namespaces' rows; with a label selector it frees a row only once the API
	// server has no Student of it.
	Scope Scope
	// SweepInterval is how often the registry is compared with the Students; 0 is never.
	SweepInterval time.Duration
	// SweepMaxDeletions and SweepMaxDeletionPercent (of the owner's rows, at least one; 0
	// means 50) cap the orphan rows one sweep deletes or releases. Over a cap it touches none
	// and reports it: likelier a fault than deletions.
	SweepMaxDeletions       int
	SweepMaxDeletionPercent int
	// MaxRewinds caps the undos (takeUndo) per process, as after an etcd restore. Past it
	// the Student is not Ready: so many look like a cloned cluster writing to production.
	MaxRewinds int
	// SyncTimeout bounds one sync, its calls included (a write sharing a transaction may wait
	// as long again), and the shutdown drain.
	SyncTimeout time.Duration
	// RateLimiter spaces retries; DefaultRateLimiter when nil.
	RateLimiter workqueue.TypedRateLimiter[string]
	// HistoryRetention is how long history rows are kept, pruned hourly; 0 keeps them all.
	HistoryRetention time.Duration
	// SweepEventTarget, when set, gets the Warning Event of a refused sweep (its own Pod).
	SweepEventTarget *corev1.ObjectReference
	// Clock stamps conditions; the real clock when nil.
	Clock clock.PassiveClock
	// Metrics records syncs, registry latency and sweeps; its own, registered nowhere, when nil.
	Metrics *Metrics
	// Tracer traces each sync; nil traces nothing, at no cost.
	Tracer trace.Tracer
	// Mark, if set, says whether the registry is behind the cluster's mark: then the sweep
	// releases nothing and a finalizer releases its row instead of deleting it.
	Mark Mark
	// CRDDeleting says whether the Student CRD is being deleted (so the API server, not a
	// user, deletes the Students): then a finalizer releases its row. NewWiring sets it.
	CRDDeleting func(ctx context.Context) (bool, error)
	// Leading says whether this replica may still write: an error once it cannot know it
	// holds the Lease (last renewal older than the renew deadline, as after a pause) or
	// another leads. Asked before every sync and write; nil always writes.
	Leading Gate
}

// Gate says whether this replica may write now: nil while it may (internal/leader).
type Gate interface{ Check() error }

// Mark says whether the registry is behind the cluster's mark; nil means checked and not.
type Mark interface{ Behind() error }

// ErrNotLeading is returned for work refused because this replica may not write.
var ErrNotLeading = errors.New("not the leader")

// conflictPatience is how many conflicts in a row log at -v=2: a lagging cache catches up.
const conflictPatience = 8

// notLeadingRetry is how long a refused key waits: time to renew the Lease or stand down.
const notLeadingRetry = time.Second

// Controller keeps the student registry in line with the Student objects.
type Controller struct {
	students *Informers
	synced   cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string] // namespace/name keys; see enqueue
	// rows and getStudent read; every write goes through write.
	rows       rowReader
	getStudent func(ctx context.Context, namespace, name string) (*studentv1.Student, error)
	write      *writes
	cfg        Config
	clock      clock.PassiveClock
	sweepNow   chan struct{}           // asks Run's sweep loop for an early sweep (SweepSoon)
	stop       context.CancelCauseFunc // ends Run when nothing is left to do (see stopsWork)
	// queueTimes is when keys were queued (nil untraced); working, when Run began to work.
	queueTimes *queueTimes
	working    time.Time
	// malformed are the uids of unreadable rows the last sweep found, to log each once; only
	// Sweep (never concurrent) uses it.
	malformed map[string]bool
	rewound   atomic.Int64 // the undos (takeUndo) since the process started
	crd       *crdWatch    // follows the served Student CRD (NewWiring); nil follows nothing
	states    *states      // what the syncs found, for the metrics
}

// DefaultRateLimiter retries one Student after 0.5s up to 5m, plus an overall bucket: the
// registry is external I/O, where client-go's 5ms adds load and its 16m hides recovery.
func DefaultRateLimiter() workqueue.TypedRateLimiter[string] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, 5*time.Minute),
		&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(50), 300)},
	)
}

// withDefaults checks cfg and fills in the defaults of its zero values.
func (cfg Config) withDefaults() (Config, error) {
	switch {
	case cfg.Owner == "":
		return cfg, errors.New("the registry owner must not be empty")
	case cfg.SweepMaxDeletions < 0:
		return cfg, fmt.Errorf("sweep max deletions must not be negative, got %d", cfg.SweepMaxDeletions)
	case cfg.SweepMaxDeletionPercent < 0 || cfg.SweepMaxDeletionPercent > 100:
		return cfg, fmt.Errorf("sweep max deletion percent must be within 0 and 100, got %d", cfg.SweepMaxDeletionPercent)
	case cfg.MaxRewinds < 0:
		return cfg, fmt.Errorf("max rewinds must not be negative, got %d", cfg.MaxRewinds)
	}
	if cfg.SyncTimeout <= 0 {
		cfg.SyncTimeout = 30 * time.Second
	}
	cfg.SweepMaxDeletionPercent = cmp.Or(cfg.SweepMaxDeletionPercent, 50)
	cfg.MaxRewinds = cmp.Or(cfg.MaxRewinds, defaultMaxRewinds)
	if cfg.RateLimiter == nil {
		cfg.RateLimiter = DefaultRateLimiter()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	return cfg, nil
}

// New returns a Controller over the Students that informers watch. Call Run to start it.
func New(ctx context.Context, client versioned.Interface, informers *Informers,
	reg Registry, recorder record.EventRecorder, cfg Config) (*Controller, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	reg = timedRegistry{Registry: reg, m: cfg.Metrics, tracer: cfg.Tracer}
	c := &Controller{
		students: informers,
		synced:   informers.HasSynced,
		rows:     reg,
		getStudent: func(ctx context.Context, namespace, name string) (*studentv1.Student, error) {
			return client.BolingcavalryV1().Students(namespace).Get(ctx, name, metav1.GetOptions{})
		},
		write:    &writes{registry: reg, client: client, recorder: recorder, leading: cfg.Leading, tracer: cfg.Tracer},
		cfg:      cfg,
		clock:    cfg.Clock,
		sweepNow: make(chan struct{}, 1),
		states:   newStates(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(cfg.RateLimiter,
			workqueue.TypedRateLimitingQueueConfig[string]{Name: Name}),
	}
	if c.clock == nil {
		c.clock = clock.RealClock{}
	}
	cfg.Metrics.states.Store(c.states)
	if cfg.Tracer != nil {
		c.queueTimes = &queueTimes{at: map[string]time.Time{}}
		c.queue = timedQueue{TypedRateLimitingInterface: c.queue, times: c.queueTimes}
	}
	logger := klog.FromContext(ctx)
	err = informers.addEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			c.observeEvent(obj)
			c.enqueue(logger, obj)
		},
		UpdateFunc: func(oldObj, newObj any) {
			c.observeEvent(newObj)
			c.enqueueUpdate(logger, oldObj, newObj)
		},
		DeleteFunc: func(obj any) {
			if key, err := cacheKey(obj); err == nil {
				c.states.forget(key)
			}
			c.enqueue(logger, obj)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("add Student event handler: %w", err)
	}
	return c, nil
}

// enqueue adds the key of a cached Student or its tombstone; anything else is reported and
// dropped. Keys are the cache's own namespace/name strings: the queue's maps never shrink,
// and a string is half a cache.ObjectName (bench/results/history.md).
func (c *Controller) enqueue(logger klog.Logger, obj any) {
	switch o := obj.(type) {
	case *cachedStudent:
		if o != nil {
			c.queue.Add(o.key)
			return
		}
	case cache.DeletedFinalStateUnknown:
		c.queue.Add(o.Key)
		return
	}
	utilruntime.HandleErrorWithLogger(logger, nil, "Not a Student; ignored", "type", fmt.Sprintf("%T", obj))
}

// observeEvent times a Student's sync latency: done once status is at its generation.
func (c *Controller) observeEvent(obj any) {
	if s, ok := obj.(*cachedStudent); ok && s != nil {
		reported := s.isReady() || (s.isObserved() && s.observedGeneration == s.generation)
		c.states.generations.seen(s.key, s.generation, reported, s.isPaused() || s.deleting(), c.clock.Now())
	}
}

// enqueueUpdate adds the key of an updated Student when the update can matter.
func (c *Controller) enqueueUpdate(logger klog.Logger, oldObj, newObj any) {
	if needsSync(oldObj, newObj) {
		c.enqueue(logger, newObj)
	}
}

// needsSync says whether an update can change what sync does: a resync can (the registry
// may drift), and so can steering annotations. The controller's own writes (status, its
// finalizer) cannot; syncing on them would reread a lagging cache and write again.
func needsSync(oldObj, newObj any) bool {
	oldS, ok1 := oldObj.(*cachedStudent)
	newS, ok2 := newObj.(*cachedStudent)
	if !ok1 || !ok2 || oldS == nil || newS == nil || oldS.resourceVersionValue() == newS.resourceVersionValue() {
		return true
	}
	oldR, newR := oldS.rareField(), newS.rareField()
	// The spec can change without its generation when the served CRD does.
	if oldS.generation != newS.generation || oldS.spec() != newS.spec() || !equality.Semantic.DeepEqual(oldR.deletionTimestamp, newR.deletionTimestamp) ||
		steered(oldS, newS) {
		return true
	}
	oldF, newF := oldS.finalizers(), newS.finalizers()
	if slices.Equal(oldF, newF) {
		return false
	}
	ownFinalizerAdded := !slices.Contains(oldF, Finalizer) && slices.Equal(append(slices.Clone(oldF), Finalizer), newF)
	return !ownFinalizerAdded
}

// SweepSoon asks for an early sweep, e.g. once a registry that was behind is confirmed.
func (c *Controller) SweepSoon() {
	select {
	case c.sweepNow <- struct{}{}:
	default:
	}
}

// Run waits for the cache, runs workers and the sweep until ctx is done, then stops taking
// work and returns once the syncs in flight finish (within SyncTimeout).
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	logger := klog.FromContext(ctx)

	logger.Info("Starting controller", "workers", workers, "owner", c.cfg.Owner)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.synced) {
		c.queue.ShutDown()
		return errors.New("the Student cache did not sync before shutdown")
	}

	c.working = time.Now()
	ctx, c.stop = context.WithCancelCause(ctx)
	defer c.stop(nil)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for c.processNextWorkItem(ctx) {
			}
		})
	}
	if c.cfg.SweepInterval > 0 {
		wg.Go(func() { c.sweepEvery(ctx) })
	}
	if c.cfg.HistoryRetention > 0 {
		wg.Go(func() { wait.JitterUntilWithContext(ctx, c.pruneHistory, historyPruneInterval, 0.1, false) })
	}
	logger.Info("Started workers")

	<-ctx.Done()
	logger.Info("Shutting down: finishing the work in flight")
	c.queue.ShutDown()
	wg.Wait()
	logger.Info("Controller stopped")
	if err := context.Cause(ctx); stopsWork(err) {
		return err
	}
	return nil
}

// sweepEvery sweeps now, then per jittered SweepInterval or SweepSoon, until it must stop.
func (c *Controller) sweepEvery(ctx context.Context) {
	select {
	case <-c.sweepNow: // the first sweep is now anyway
	default:
	}
	for ctx.Err() == nil {
		start := time.Now()
		result, err := c.Sweep(ctx)
		c.cfg.Metrics.observeSweep(result, err, time.Since(start))
		if stopsWork(err) {
			c.stop(err)
			return
		}
		if err != nil {
			utilruntime.HandleErrorWithContext(ctx, err, "Sweep failed; the next one retries")
		}
		next := time.NewTimer(wait.Jitter(c.cfg.SweepInterval, 0.1))
		select {
		case <-ctx.Done():
		case <-next.C:
		case <-c.sweepNow:
		}
		next.Stop()
	}
}

// stopsWork says whether err leaves this controller nothing to do, so it must stop.
func stopsWork(err error) bool {
	return errors.Is(err, registry.ErrOtherCluster) || errors.Is(err, registry.ErrFenced) || errors.Is(err, registry.ErrSchemaNewer)
}

const historyPruneInterval = time.Hour

// pruneHistory deletes history past Config.HistoryRetention if this replica may write.
func (c *Controller) pruneHistory(ctx context.Context) {
	cutoff := c.clock.Now().Add(-c.cfg.HistoryRetention)
	res, err := c.write.apply(ctx, registry.Op{Kind: registry.OpPruneHistory, Before: cutoff})
	if errors.Is(err, ErrNotLeading) {
		return
	}
	if err != nil && ctx.Err() == nil {
		utilruntime.HandleErrorWithContext(ctx, err, "Pruning the registry history failed; the next prune retries", "pruned", res.Pruned)
		return
	}
	if res.Pruned > 0 {
		klog.FromContext(ctx).Info("Pruned the registry history", "rows", res.Pruned, "before", cutoff.UTC().Format(time.RFC3339))
	}
}

// HasSynced reports whether the Student cache has synced, for readiness.
func (c *Controller) HasSynced() bool { return c.synced() }

// processNextWorkItem takes one key and syncs it; handled decides what happens next.
func (c *Controller) processNextWorkItem(ctx context.Context) bool {
	key, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(key)
	if ctx.Err() != nil {
		// Shutting down: the rest of the queue is left to the next leader.
		return false
	}

	// A started sync outlives shutdown (bounded), so no write is cut half way.
	syncCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.SyncTimeout)
	defer cancel()
	syncCtx, span := c.startSync(syncCtx, key)
	started := time.Now()
	err := c.mayStart()
	if err == nil {
		err = c.sync(syncCtx, key)
	}

	// A KRef, as every log line names it, so a JSON log's student field has one type.
	namespace, name, _ := cache.SplitMetaNamespaceKey(key)
	student := klog.KRef(namespace, name)
	result := c.handled(ctx, key, student, err)
	endSync(span, result, err)
	took := time.Since(started)
	c.cfg.Metrics.observeSync(result, took)
	if logger := klog.FromContext(ctx); logger.V(4).Enabled() {
		logger.V(4).Info("Synced Student", "student", student, "result", result, "duration", took)
	}
	return true
}

// handled acts on a sync's error (forget, retry or stop): the one place that judges it.
func (c *Controller) handled(ctx context.Context, key string, student klog.ObjectRef, err error) string {
	var term *terminalError
	result := resultSuccess
	switch {
	case err == nil:
		c.queue.Forget(key)
	case errors.Is(err, ErrNotLeading):
		// Likely a paused leader not yet aware it lost the Lease: it writes nothing.
		result = resultNotLeading
		c.queue.Forget(key)
		c.queue.AddAfter(key, notLeadingRetry)
		klog.FromContext(ctx).V(2).Info("Not writing; will retry", "student", student, "reason", err)
	case errors.Is(err, registry.ErrFenced):
		// A new leader took over the owner's writes: this write was rolled back. Stop.
		result = resultNotLeading
		c.queue.Forget(key)
		klog.FromContext(ctx).Info("Another controller took over the registry owner's writes; stopping", "student", student, "err", err)
		if c.stop != nil {
			c.stop(err)
		}
	case errors.As(err, &term):
		// Retrying cannot help; a change to the object brings it back.
		result = resultTerminal
		c.queue.Forget(key)
		klog.FromContext(ctx).V(2).Info("Not retrying", "student", student, "reason", err)
	case apierrors.IsConflict(err), errors.Is(err, registry.ErrStale), errors.Is(err, errCacheBehind):
		// The cache lagged the API server or the row's other writer: retry, not an error.
		result = resultConflict
		c.queue.AddRateLimited(key)
		if n := c.queue.NumRequeues(key); n > conflictPatience {
			// Not the usual race with the watch any more: say so where it is seen.
			utilruntime.HandleErrorWithContext(ctx, err, "Syncing Student keeps conflicting; will retry", "student", student, "retries", n)
		} else {
			klog.FromContext(ctx).V(2).Info("Conflict; will retry", "student", student, "err", err)
		}
	default:
		result = resultError
		c.queue.AddRateLimited(key)
		utilruntime.HandleErrorWithContext(ctx, err, "Syncing Student failed; will retry", "student", student, "retries", c.queue.NumRequeues(key))
	}
	return result
}

// mayStart refuses a sync or sweep before it reads anything if this replica may not
// write: a sweep on a cache as old as a pause would take live rows for orphans.
func (c *Controller) mayStart() error { return c.write.allowed() }

// terminalError is a sync failure that retrying cannot fix.
type terminalError struct{ err error }

func (e *terminalError) Error() string { return e.err.Error() }
func (e *terminalError) Unwrap() error { return e.err }

func terminal(err error) error { return &terminalError{err: err} }
