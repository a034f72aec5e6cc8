package controller

import (
	"context"
	"errors"
	"time"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// dryRunSettle is how long a dry run waits after a change before planning again, so a
// burst of changes costs one plan.
const dryRunSettle = 5 * time.Second

// dryRunPlanTimeout bounds one plan: the list of owned rows and the reads of the others.
const dryRunPlanTimeout = 2 * time.Minute

// RunDryRun is Run for --dry-run: once the cache syncs, it plans (as `plan` does) on each
// Student change and every interval (the registry drifts too), logs new actions and sets
// the planned-actions gauge. It writes nothing, not even a Lease: each replica plans
// alone.
func (c *Controller) RunDryRun(ctx context.Context, interval time.Duration) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	logger := klog.FromContext(ctx)
	logger.Info("Starting controller in dry-run mode: it writes nothing", "owner", c.cfg.Owner, "interval", interval)
	defer c.queue.ShutDown()
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.synced) {
		return errors.New("the Student cache did not sync before shutdown")
	}

	// The event handlers fill the queue as in Run; here a key only says something changed.
	changed := make(chan struct{}, 1)
	go func() {
		for {
			key, shutdown := c.queue.Get()
			if shutdown {
				return
			}
			c.queue.Done(key)
			c.queueTimes.taken(key) // no sync, no trace: forgotten
			select {
			case changed <- struct{}{}:
			default:
			}
		}
	}()

	var last map[PlannedAction]bool
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		last = c.dryRun(ctx, last)
		select {
		case <-ctx.Done():
			logger.Info("Dry run stopped")
			return nil
		case <-ticker.C:
		case <-changed:
			select {
			case <-ctx.Done():
			case <-time.After(dryRunSettle):
			}
		}
	}
}

// dryRun plans once, logs actions not in seen, and returns its actions (seen on failure).
func (c *Controller) dryRun(ctx context.Context, seen map[PlannedAction]bool) map[PlannedAction]bool {
	logger := klog.FromContext(ctx)
	planCtx, cancel := context.WithTimeout(ctx, dryRunPlanTimeout)
	defer cancel()
	plan, err := c.Plan(planCtx)
	if err != nil {
		if ctx.Err() == nil {
			utilruntime.HandleErrorWithContext(ctx, err, "Dry run: planning failed; the next plan retries")
		}
		return seen
	}
	c.cfg.Metrics.observePlan(plan)
	now := make(map[PlannedAction]bool, len(plan.Actions))
	fresh := seen == nil
	for _, a := range plan.Actions {
		now[a] = true
		if !seen[a] {
			fresh = true
			logger.Info("Dry run: would act", "action", a.Action, "student", klog.KRef(a.Namespace, a.Name), "uid", a.UID, "cause", a.Cause)
		}
	}
	if fresh || len(now) != len(seen) {
		logger.Info("Dry run: planned", "changes", plan.Changes(), "actions", len(plan.Actions), "students", plan.Students,
			"rows", plan.Rows, "paused", plan.Paused, "sweepRefused", plan.SweepRefused)
	}
	return now
}

// Plan is what the controller would do now, from its cache and the registry, as
// `student-controller plan` plans it.
func (c *Controller) Plan(ctx context.Context) (Plan, error) {
	cached := c.students.list()
	students := make([]*studentv1.Student, len(cached))
	for i, s := range cached {
		students[i] = s.student()
	}
	crd, err := c.crdState(ctx)
	if err != nil {
		return Plan{}, err
	}
	return PlanFor(ctx, c.rows, PlanScope{Scope: c.cfg.Scope, Exists: c.studentExists, PlanPolicy: PlanPolicy{
		Owner: c.cfg.Owner, SweepMaxDeletions: c.cfg.SweepMaxDeletions, SweepMaxDeletionPercent: c.cfg.SweepMaxDeletionPercent,
		NoSweep: c.cfg.SweepInterval == 0, CRD: crd, CRDOlder: c.crd.Older() != nil, RegistryBehind: c.registryBehind() != nil,
		MaxUndo: c.cfg.MaxRewinds,
	}}, students)
}
