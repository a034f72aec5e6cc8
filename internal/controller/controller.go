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

// Registry is what the controller needs of the student registry: its reads, and one
// method for every write.
type Registry interface {
	rowReader
	Apply(ctx context.Context, op registry.Op) (registry.Result, error)
}

// rowReader is what the controller reads of the registry; its writes go through
// writes.
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
	// Cluster identifies the cluster the Students live in (its kube-system namespace's
	// UID). When set, every sweep first checks that the registry binds Owner to it, and
	// the controller stops if not: another cluster's controller took the owner over.
	Cluster string
	// Scope is which Students the controller watches (NewWiring sets it to the
	// informers'). The sweep compares only the owner's rows of its namespaces, and with
	// a label selector lets go of a row only once the API server has no Student of it:
	// a row outside the scope is never an orphan of this controller.
	Scope Scope
	// SweepInterval is how often the registry is compared with the Students; 0 turns the
	// periodic sweep off.
	SweepInterval time.Duration
	// SweepMaxDeletions bounds the orphan rows one sweep deletes or releases: a sweep
	// that would touch more touches none and reports it, since that is likelier a fault
	// (a wrong cluster, a deleted CRD, a cache that lost its Students) than real
	// deletions. SweepMaxDeletionPercent bounds them too, as a share of the rows the
	// owner holds (at least one row); 0 means 50.
	SweepMaxDeletions       int
	SweepMaxDeletionPercent int
	// MaxRewinds bounds the rows ahead of their Students (an etcd restore) that this
	// controller takes back to its Students (Rewind) from its start; past it a row
	// ahead makes its Student not Ready instead, since so many rows ahead looks like a
	// cloned cluster writing to production's registry. 0 means defaultMaxRewinds.
	MaxRewinds int
	// SyncTimeout bounds one sync, registry and API calls included (a registry write
	// that shares its transaction waits for it to end: up to this long again). It also
	// bounds the drain on shutdown: work in flight finishes, within this time.
	SyncTimeout time.Duration
	// RateLimiter spaces retries; DefaultRateLimiter when nil.
	RateLimiter workqueue.TypedRateLimiter[string]
	// HistoryRetention is how long the registry's history rows are kept: older ones
	// are pruned every hour, by the replica that writes. 0 keeps them all.
	HistoryRetention time.Duration
	// SweepEventTarget, when set, receives the Warning Event of a refused sweep (the
	// controller's own Pod, in a cluster).
	SweepEventTarget *corev1.ObjectReference
	// Clock stamps conditions; the real clock when nil.
	Clock clock.PassiveClock
	// Metrics records syncs, registry latency and sweeps; nothing is recorded when nil.
	Metrics *Metrics
	// Tracer traces each sync (its queue wait, registry operations and status write);
	// nil traces nothing, at no cost.
	Tracer trace.Tracer
	// Mark, when set, says whether the registry may be trusted about rows without
	// Students: not while it is behind the cluster's mark of it (it went back in time,
	// and no operator has confirmed it). Then the sweep releases nothing, and a
	// finalizer releases a row instead of deleting it.
	Mark Mark
	// CRDDeleting, when set, says whether the Student CRD is being deleted: then every
	// Student is deleted by the API server, not by a user, and a finalizer releases its
	// row instead of deleting it. NewWiring sets it; unset, the CRD is never deleting.
	CRDDeleting func(ctx context.Context) (bool, error)
	// Leading, when set, says whether this replica may still write: an error once it
	// cannot know that it holds the leader Lease (its last renewal is older than the
	// renew deadline, as after a pause) or another replica leads. It is asked before
	// every sync and every write, registry and API alike; a key it refuses waits in the
	// queue. Unset, the controller always writes (no leader election).
	Leading Gate
}

// Gate says whether this replica may write now: nil while it may (internal/leader).
type Gate interface{ Check() error }

// Mark says whether the registry is behind the cluster's mark of it: nil once the
// marks were compared and it is not (internal/mark).
type Mark interface{ Behind() error }

// ErrNotLeading is returned for work refused because this replica may not write.
var ErrNotLeading = errors.New("not the leader")

// conflictPatience is how many retries of a conflict in a row are logged at -v=2 only:
// a cache behind the API server catches up within a few; more are logged as errors.
const conflictPatience = 8

// notLeadingRetry is how long a key refused by Config.Leading waits before it is tried
// again: by then this replica has renewed its Lease, or stood down.
const notLeadingRetry = time.Second

// Controller keeps the student registry in line with the Student objects.
type Controller struct {
	// students is the cache the syncs, the sweep and plans read.
	students *Informers
	synced   cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string] // namespace/name keys; see enqueue
	// rows and getStudent read; every write goes through write.
	rows       rowReader
	getStudent func(ctx context.Context, namespace, name string) (*studentv1.Student, error)
	write      *writes
	cfg        Config
	clock      clock.PassiveClock
	// sweepNow asks Run's sweep loop for a sweep before its interval is up (SweepSoon).
	sweepNow chan struct{}
	// stop ends Run with a cause that leaves this controller nothing to do: the owner
	// moved to another cluster, or another controller took over the owner's writes.
	stop context.CancelCauseFunc
	// queueTimes are when the keys in the queue were queued, for their traces; nil
	// when tracing is off. working is when Run started to work (its cache synced).
	queueTimes *queueTimes
	working    time.Time
	// malformed are the uids of the unreadable rows the last sweep found; a row is
	// logged when it first shows up here. Only Sweep, which never runs twice at once,
	// touches it.
	malformed map[string]bool
	// rewound counts the rows of production's past undone since the controller was
	// made (the process started), against Config.MaxRewinds: rows ahead rewound,
	// released rows taken back, deleted rows written again, and those being written
	// (takeUndo).
	rewound atomic.Int64
	// crd follows the served Student CRD (NewWiring); nil follows nothing.
	crd *crdWatch
	// states are what the syncs found of the Students, for the metrics.
	states *states
}

// DefaultRateLimiter spaces the retries of one Student from half a second up to five
// minutes: the registry is external I/O, where client-go's first retry after 5
// milliseconds only adds load to an outage, and 16 minutes is too long to notice
// recovery. An overall bucket caps the retry rate across all Students.
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
	return cfg, nil
}

// New returns a Controller over the Students that informers watch. It starts
// nothing: call Run.
func New(ctx context.Context, client versioned.Interface, informers *Informers,
	reg Registry, recorder record.EventRecorder, cfg Config) (*Controller, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.Metrics != nil || cfg.Tracer != nil {
		reg = timedRegistry{Registry: reg, m: cfg.Metrics, tracer: cfg.Tracer}
	}
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
	if cfg.Metrics != nil {
		cfg.Metrics.states.Store(c.states)
	}
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

// enqueue adds the key of a cached Student, or of the tombstone of a deleted one. Keys
// are namespace/name strings rather than cache.ObjectName: the workqueue's maps grow to
// the largest backlog and Go maps never shrink, and a string key is about half the size
// (bench/results/history.md). The key queued is the cache's own string, not a copy.
//
// Only a cached Student, or the tombstone of one, has a key here: a tombstone's key
// names the Student that was deleted, whatever its last known state inside. Anything
// else is reported and dropped, rather than its name taken for a Student's.
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

// observeEvent starts or stops the sync latency's clock of a cached Student, as a
// watch event shows it. An observed Student's sync is done once its status is at its
// generation, drifted or not.
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

// needsSync says whether an update can change what sync does. A resync, which repeats
// the same object, can, since the registry may have drifted; so can a change of the
// annotations that steer the controller (pause, a reconcile request). The controller's own
// writes cannot: a change to status alone, or the addition of its finalizer, which
// the same sync followed with the row and the status. Syncing on them would only read
// a cache that may not have caught up yet with that status, and write it again.
func needsSync(oldObj, newObj any) bool {
	oldS, ok1 := oldObj.(*cachedStudent)
	newS, ok2 := newObj.(*cachedStudent)
	if !ok1 || !ok2 || oldS == nil || newS == nil || oldS.resourceVersionValue() == newS.resourceVersionValue() {
		return true
	}
	oldR, newR := oldS.rareField(), newS.rareField()
	// The spec changes without its generation when the served CRD does (a field
	// pruned by an older one, or given back).
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

// SweepSoon asks for a sweep now rather than at the end of the sweep interval (an
// operator confirmed a registry that was behind: the rows its sweeps kept may go now).
// Nothing when the sweep is off; one sweep for several asks.
func (c *Controller) SweepSoon() {
	select {
	case c.sweepNow <- struct{}{}:
	default:
	}
}

// Run waits for the informer cache, then runs workers and the periodic sweep until ctx
// is done. Then it stops taking work, lets the syncs in flight finish (each within
// SyncTimeout), and returns.
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

// sweepEvery sweeps now and then every Config.SweepInterval, jittered, from the end
// of each sweep, or sooner when asked; until ctx ends or a sweep finds that this
// controller must stop.
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

// stopsWork tells the errors that leave this controller nothing to do: the owner moved
// to another cluster, another controller took over its writes, or a newer program
// migrated the registry's schema.
func stopsWork(err error) bool {
	return errors.Is(err, registry.ErrOtherCluster) || errors.Is(err, registry.ErrFenced) || errors.Is(err, registry.ErrSchemaNewer)
}

// historyPruneInterval is how often the history is pruned to Config.HistoryRetention.
const historyPruneInterval = time.Hour

// pruneHistory deletes the history rows older than Config.HistoryRetention, when this
// replica may write (the next prune does it otherwise).
func (c *Controller) pruneHistory(ctx context.Context) {
	cutoff := c.clock.Now().Add(-c.cfg.HistoryRetention)
	res, err := c.write.apply(ctx, registry.Op{Kind: registry.OpPruneHistory, Before: cutoff})
	n := res.Pruned
	if errors.Is(err, ErrNotLeading) {
		return
	}
	if err != nil && ctx.Err() == nil {
		utilruntime.HandleErrorWithContext(ctx, err, "Pruning the registry history failed; the next prune retries", "pruned", n)
		return
	}
	if n > 0 {
		klog.FromContext(ctx).Info("Pruned the registry history", "rows", n, "before", cutoff.UTC().Format(time.RFC3339))
	}
}

// HasSynced reports whether the Student cache has synced, for readiness.
func (c *Controller) HasSynced() bool { return c.synced() }

// processNextWorkItem takes one key and syncs it. It is the only place that decides
// what happens to a key afterwards: forget it, or retry it with backoff.
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

	// A sync that started runs to its end even when shutdown begins, so that a write
	// is not cut off half way (finalizer added, row not yet written); it is bounded.
	syncCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.SyncTimeout)
	defer cancel()
	syncCtx, span := c.startSync(syncCtx, key)
	started := time.Now()
	err := c.mayStart()
	if err == nil {
		err = c.sync(syncCtx, key)
	}

	// The Student as every other log line of it names it: an object, not a string,
	// so that a JSON log's student field has one type.
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

// handled classifies the error a sync of key returned, the one place that does, and
// does with the key what it calls for: forget it, retry it later, or stop. It returns
// the result the metrics and the trace record.
func (c *Controller) handled(ctx context.Context, key string, student klog.ObjectRef, err error) string {
	var term *terminalError
	result := resultSuccess
	switch {
	case err == nil:
		c.queue.Forget(key)
	case errors.Is(err, ErrNotLeading):
		// A paused leader that woke up, before it learns that it lost the Lease: it
		// writes nothing until it renews, or stands down and exits.
		result = resultNotLeading
		c.queue.Forget(key)
		c.queue.AddAfter(key, notLeadingRetry)
		klog.FromContext(ctx).V(2).Info("Not writing; will retry", "student", student, "reason", err)
	case errors.Is(err, registry.ErrFenced):
		// Another controller of the owner took over its writes (a new leader): this
		// one's write was rolled back, and it stops.
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
		// The cache was behind the API server, or behind another writer of the row;
		// the retry reads the newer object. No failure: nothing counts it as an error.
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

// mayStart refuses a unit of work (a sync, a sweep) before it reads anything when this
// replica may not write: it would have nothing to do, and a sweep on a cache as old as
// a pause would take live rows for orphans.
func (c *Controller) mayStart() error { return c.write.allowed() }

// terminalError is a sync failure that retrying cannot fix.
type terminalError struct{ err error }

func (e *terminalError) Error() string { return e.err.Error() }
func (e *terminalError) Unwrap() error { return e.err }

func terminal(err error) error { return &terminalError{err: err} }
