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

// sweepRows runs decide.Sweep for every owned row and every cached Student without one:
// it returns the Students whose rows to repair, and the rows without a Student.
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
	Rows     int // owned rows compared
	Resync   int // Students queued to repair their rows
	Orphans  int // owned rows without a Student
	Released int // orphans released; they keep the policy they record: a missing Student never deletes a row
	// Live are cache orphans whose Student the API server still has: the cache was behind (a
	// watch cut, a new leader's first minutes), and the row stays.
	Live      int
	Malformed int  // owned rows skipped, unreadable: their Students' syncs rewrite them, if any
	Refused   bool // the sweep let go of none (orphans past the bound, or registry behind)
}

// Sweep compares owned rows with cached Students (Run calls it once the cache synced): it
// queues the Students of missing or differing rows, and releases rows whose Student is
// gone, unless past the bound. It never deletes them: absence is no proof of deletion.
func (c *Controller) Sweep(ctx context.Context) (SweepResult, error) {
	logger := klog.FromContext(ctx)
	if err := c.sweepMayWrite(ctx); err != nil {
		return SweepResult{}, fmt.Errorf("sweep: %w", err)
	}
	// Rows first, cache second: a Student deleted in between had its row let go by its
	// finalizer, so a stale row here costs at most a release that finds nothing.
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
		// A Student may exist with labels outside the selector: its row is out of scope,
		// neither an orphan nor counted in the guard's share (as plan counts).
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

// sweepMayWrite checks, before reading, that no newer controller migrated the schema (a
// rolling update, a second install) and that the owner was not moved to another cluster.
func (c *Controller) sweepMayWrite(ctx context.Context) error {
	_, err := c.write.apply(ctx, registry.Op{Kind: registry.OpBind, Record: registry.Record{Owner: c.cfg.Owner}, Cluster: c.cfg.Cluster})
	return err
}

// sweepRefuses says whether the sweep lets no orphan go (decide.SweepHolds), logging why.
func (c *Controller) sweepRefuses(logger klog.Logger, orphans []registry.Record, rows, students int) bool {
	bound := decide.SweepBound(c.cfg.SweepMaxDeletions, c.cfg.SweepMaxDeletionPercent, rows)
	switch decide.SweepHolds(len(orphans), bound, c.registryBehind() != nil) {
	case decide.SweepPastBound:
		msg := fmt.Sprintf("Sweep refused to let go of %d of the %d registry rows it owns whose Students it cannot find, more than "+
			"it lets go at once (%d): nothing was released (docs/runbooks.md#studentsweeprefused)", len(orphans), rows, bound)
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

// letGoOrphans releases each orphan whose Student the API server, asked now, lacks too (the
// cache may be behind; withoutLive already asked under a selector), and counts in result.
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

// withoutLive drops the orphans whose Student still exists, counting them in result.Live.
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

// studentExists asks the API server whether the row's Student exists (HasRow).
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

// relinquishWithin lets go of row uid, bounded by --sync-timeout like a sync's calls:
// the write may share a group-commit transaction that ends only once all give up.
func (c *Controller) relinquishWithin(ctx context.Context, uid string) (registry.Outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.SyncTimeout)
	defer cancel()
	res, err := c.write.apply(ctx, registry.Op{Kind: registry.OpRelinquish, Record: registry.Record{UID: uid, Owner: c.cfg.Owner},
		Why: registry.Why{Cause: registry.CauseSweep}})
	return res.Outcome, err
}
