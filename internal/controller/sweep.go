package controller

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/student-controller/student-controller/internal/decide"
	"github.com/student-controller/student-controller/internal/registry"
)

// sweepRows decides for every row of the owner (decide.Sweep) and every cached
// Student without one: the Students whose rows to repair (resync), and the rows
// without a Student (orphans).
func sweepRows(owner string, rows []registry.Record, students []*cachedStudent) (resync []string, orphans []registry.Record) {
	byRow := make(map[string]*cachedStudent, len(students))
	for _, s := range students {
		byRow[s.rowUID()] = s
	}
	decided := func(row *registry.Record, s *cachedStudent) {
		var named *decide.Student
		if s != nil {
			f := s.facts()
			named = &f
		}
		switch decide.Sweep(owner, row, named) {
		case decide.SweepResync:
			resync = append(resync, s.key)
		case decide.SweepRelease:
			orphans = append(orphans, *row)
		}
	}
	for i, row := range rows {
		s := byRow[row.UID]
		delete(byRow, row.UID)
		decided(&rows[i], s)
	}
	for _, s := range students {
		if _, rowless := byRow[s.rowUID()]; rowless {
			decided(nil, s)
		}
	}
	return resync, orphans
}

// SweepResult is what one sweep found and did.
type SweepResult struct {
	Rows    int // owned rows compared
	Resync  int // Students queued to repair their rows
	Orphans int // owned rows without a Student
	// Released are orphan rows released as they stood, with the policy they record:
	// no path that finds a row without its Student deletes it.
	Released int
	// Live are orphans by the cache whose Student the API server still has: the cache
	// was behind (a watch cut, a new leader's first minutes), and the row stays.
	Live int
	// Malformed are owned rows that cannot be read, skipped: their Students' syncs
	// rewrite them, and rows of no Student are left to whoever wrote them.
	Malformed int
	// Refused is set when the orphans were more than the safety bound allows, and
	// none was deleted or released.
	Refused bool
}

// Sweep compares every row this controller owns with the Students in the cache: rows
// that are missing or differ are repaired by queueing their Student, and owned rows
// whose Student is gone are released as they stand (never deleted: absence is no
// evidence of a deletion), unless there are more of them than the bound allows. Run only calls it once the
// cache has synced.
func (c *Controller) Sweep(ctx context.Context) (SweepResult, error) {
	logger := klog.FromContext(ctx)
	if err := c.sweepMayWrite(ctx); err != nil {
		return SweepResult{}, fmt.Errorf("sweep: %w", err)
	}
	// Rows first, cache second: a Student deleted in between has had its row let go by
	// its finalizer, so a stale row read here at worst costs a release that finds nothing.
	rows, malformed, err := c.rows.List(ctx, c.cfg.Owner)
	if err != nil {
		return SweepResult{}, fmt.Errorf("sweep: %w", err)
	}
	c.reportMalformed(logger, malformed)
	rows = c.cfg.Scope.rowsIn(rows)
	students := c.students.list()
	resync, orphans := sweepRows(c.cfg.Owner, rows, students)
	result := SweepResult{Rows: len(rows), Resync: len(resync), Orphans: len(orphans), Malformed: len(malformed)}
	for _, key := range resync {
		c.queue.Add(key)
	}

	if err := c.mayStart(); err != nil {
		// The next leader's sweep does it, or this one's once it has renewed.
		return result, fmt.Errorf("sweep: %w", err)
	}
	if c.cfg.Scope.Labeled() && len(orphans) > 0 {
		// A row's Student may be there with labels outside the selector: out of scope,
		// neither an orphan nor one of the rows the guard's share is of (as plan counts).
		var err error
		if orphans, err = c.withoutLive(ctx, orphans, &result); err != nil {
			return result, err
		}
		result.Rows -= result.Live
	}
	if result.Refused = c.sweepRefuses(logger, orphans, result.Rows, len(students)); result.Refused {
		return result, nil
	}
	errs := c.letGoOrphans(ctx, orphans, &result)
	if result.Resync > 0 || result.Orphans > 0 || len(errs) > 0 {
		logger.Info("Sweep found rows to repair or let go", "rows", result.Rows, "resync", result.Resync, "orphans", result.Orphans,
			"released", result.Released, "studentStillThere", result.Live)
	} else {
		logger.V(4).Info("Sweep found no drift", "rows", result.Rows)
	}
	if len(errs) > 0 {
		return result, fmt.Errorf("sweep: %w", errors.Join(errs...))
	}
	return result, nil
}

// sweepMayWrite checks what a sweep checks before it reads: a controller of a newer
// version may have migrated the schema since this one started (a rolling update, a
// second install), or the owner been moved to another cluster while this one ran.
func (c *Controller) sweepMayWrite(ctx context.Context) error {
	_, err := c.write.apply(ctx, registry.Op{Kind: registry.OpBind, Record: registry.Record{Owner: c.cfg.Owner}, Cluster: c.cfg.Cluster})
	return err
}

// sweepRefuses says whether the sweep lets go of none of orphans, out of the rows it
// owns (decide.SweepHolds). It logs why, and posts SweepRefused past the bound.
func (c *Controller) sweepRefuses(logger klog.Logger, orphans []registry.Record, rows, students int) bool {
	bound := c.sweepBound(rows)
	switch decide.SweepHolds(len(orphans), bound, c.registryBehind() != nil) {
	case decide.SweepPastBound:
		msg := fmt.Sprintf("Sweep refused to let go of %d of the %d registry rows it owns whose Students it cannot find: "+
			"more than it lets go at once (%d). A controller that watches the wrong cluster or namespaces, or a Student CRD "+
			"deleted or not yet served, looks like this. Nothing was deleted or released; the rows stay until their "+
			"Students are seen again. If those Students really are gone, raise --sweep-max-deletions and --sweep-max-deletion-percent "+
			"for one sweep: released rows are kept, and student-controller registry prune deletes those whose policy was Delete",
			len(orphans), rows, bound)
		logger.Error(nil, msg, "orphans", len(orphans), "rows", rows, "bound", bound, "students", students)
		if c.cfg.SweepEventTarget != nil {
			c.write.warn(c.cfg.SweepEventTarget, EventSweepRefused, msg)
		}
		return true
	case decide.SweepRegistryBehind:
		logger.Info("Sweep lets go of no row: the registry cannot be trusted about rows without Students yet",
			"orphans", len(orphans), "reason", c.registryBehind().Error())
		return true
	}
	return false
}

// letGoOrphans releases each of orphans whose Student the API server, asked now, does
// not have either (the cache may be behind; withoutLive asked already under a label
// selector), and counts what it did in result.
func (c *Controller) letGoOrphans(ctx context.Context, orphans []registry.Record, result *SweepResult) []error {
	var errs []error
	for _, row := range orphans {
		if !c.cfg.Scope.Labeled() {
			live, err := c.studentExists(ctx, row)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if live {
				result.Live++
				continue
			}
		}
		outcome, err := c.relinquishWithin(ctx, row.UID)
		if errors.Is(err, ErrNotLeading) {
			// The next leader's sweep does it, or this one's once it has renewed.
			return append(errs, err)
		}
		if err != nil && !errors.Is(err, registry.ErrNotOwned) && !errors.Is(err, registry.ErrObserved) {
			errs = append(errs, err)
			continue
		}
		c.observeLetGo(outcome, true)
		if outcome == registry.Released {
			result.Released++
		}
		if outcome != registry.Absent {
			klog.FromContext(ctx).V(2).Info("Sweep let go of an orphan registry row", "action", outcome, "deletionPolicy", row.DeletionPolicy,
				"uid", row.UID, "student", klog.KRef(row.Namespace, row.Name))
		}
	}
	return errs
}

// sweepBound is the most orphan rows one sweep lets go of, out of the rows the owner
// holds (decide.SweepBound).
func (c *Controller) sweepBound(rows int) int {
	return decide.SweepBound(c.cfg.SweepMaxDeletions, c.cfg.SweepMaxDeletionPercent, rows)
}

// withoutLive keeps the orphans by the cache whose Students the API server does not
// have, and counts the others in result.Live.
func (c *Controller) withoutLive(ctx context.Context, orphans []registry.Record, result *SweepResult) ([]registry.Record, error) {
	var gone []registry.Record
	for _, row := range orphans {
		live, err := c.studentExists(ctx, row)
		if err != nil {
			return nil, err
		}
		if live {
			result.Live++
			continue
		}
		gone = append(gone, row)
	}
	result.Orphans = len(gone)
	return gone, nil
}

// studentExists asks the API server whether the Student of a row exists: by the
// namespace and name the row records, a Student that may be the row's (HasRow).
func (c *Controller) studentExists(ctx context.Context, row registry.Record) (bool, error) {
	live, err := c.getStudent(ctx, row.Namespace, row.Name)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("sweep: confirm that Student %s/%s is gone: %w", row.Namespace, row.Name, err)
	}
	return HasRow(live, row), nil
}

// reportMalformed logs each unreadable row once, when a sweep first finds it.
func (c *Controller) reportMalformed(logger klog.Logger, rows []registry.MalformedRow) {
	seen := make(map[string]bool, len(rows))
	for _, row := range rows {
		seen[row.UID] = true
		if !c.malformed[row.UID] {
			logger.Error(nil, "Registry row cannot be read; the sweep skips it", "uid", row.UID, "problem", row.Problem)
		}
	}
	c.malformed = seen
}

// relinquishWithin lets go of row uid for the sweep, bounded by --sync-timeout as a
// sync's registry calls are: the write may share a transaction with the workers'
// (group commit), which ends only once every write in it has given up.
func (c *Controller) relinquishWithin(ctx context.Context, uid string) (registry.Outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.SyncTimeout)
	defer cancel()
	res, err := c.write.apply(ctx, registry.Op{Kind: registry.OpRelinquish, Record: registry.Record{UID: uid, Owner: c.cfg.Owner},
		Why: registry.Why{Cause: registry.CauseSweep}})
	return res.Outcome, err
}
