package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// Undoing production's past: a row ahead of its Student rewound, a released row taken
// back, a deleted row written again. Each is what an etcd restore calls for, and what
// a clone of the cluster would do to production's registry, so each is confirmed with
// the API server first, counted against Config.MaxRewinds, reported, and refused past
// the bound.

// registryAhead handles a row that the registry refused to write over because it
// holds a newer generation than the Student. Either this cache is behind (the watch
// brings the newer Student: retried), or the registry has seen a future that the
// cluster lost: etcd was restored from a backup, and the Student went back to an
// older generation. The row is read first and the API server asked second, with a
// quorum read; only if the Student there is still the cache's, and older than the
// row, does the row follow it (Rewind). The API server holds the desired state: the
// history, a Warning Event, a metric and an alert say what happened.
func (c *Controller) registryAhead(ctx context.Context, s *studentv1.Student, want registry.Record) (registry.Record, error) {
	row, err := c.rows.Get(ctx, want.UID)
	switch {
	case err != nil:
		return row, err
	case row.Owner != want.Owner:
		return row, fmt.Errorf("row %s is owned by %q: %w", row.UID, row.Owner, registry.ErrNotOwned)
	}
	live, err := c.confirmCurrent(ctx, s)
	if live == nil {
		return row, cmp.Or(err, errStudentGone)
	}
	// What is written is the API server's Student, as the quorum read returned it.
	want = recordOf(want.Owner, live)
	if row.Generation <= want.Generation {
		return row, fmt.Errorf("row %s changed since the write was refused: %w", row.UID, registry.ErrStale)
	}
	if !c.takeUndo() {
		return row, c.refuseRewind(ctx, s, row, want)
	}
	rewound, err := c.write.rewind(ctx, want, row.Generation)
	if err != nil {
		c.giveUndoBack()
		return row, err
	}
	c.cfg.Metrics.observeRegistryAhead()
	msg := fmt.Sprintf("The registry row held generation %d, newer than this Student's %d: the cluster went back to an earlier state "+
		"(etcd restored from a backup) or the row was changed by hand. The row follows the Student again: %s, %s",
		row.Generation, want.Generation, want.StudentName, want.School)
	c.write.warn(s, EventRegistryAhead, msg)
	klog.FromContext(ctx).Info("Registry row was ahead of its Student; it follows the Student again",
		"rowGeneration", row.Generation, "generation", want.Generation)
	return rewound, nil
}

// takeBack owns and writes again the row that this owner released for this very
// Student (its uid): the Student's finalizer released it and then an etcd restore
// brought the Student back, or its Student was missing to a sweep (a watch cut, a CRD
// served late) and is back. The API server is asked first (a quorum read): only a
// Student there, the one in the cache, takes the row back. Each take-back undoes a
// release, so it counts against Config.MaxRewinds with the rows rewound; past it the
// Student says so (RowReleased) and nothing is written.
func (c *Controller) takeBack(ctx context.Context, s *studentv1.Student, want, row registry.Record) (registry.Record, string, error) {
	live, err := c.confirmCurrent(ctx, s)
	if live == nil {
		return row, "", cmp.Or(err, errStudentGone)
	}
	want = recordOf(want.Owner, live)
	if !c.takeUndo() {
		msg := fmt.Sprintf("The registry row of this Student was released by this controller (%s) at %s, and this controller has "+
			"taken back %d rows since it started, its bound (--registry-max-rewinds): so many looks like a cluster gone back in "+
			"time wholesale or a clone, not one Student restored. Nothing was written. If this cluster is the one the registry "+
			"follows, restart the controller with a higher --registry-max-rewinds",
			cmp.Or(row.ReleaseCause, "unknown cause"), row.ReleasedAt.Format(time.RFC3339), c.cfg.MaxRewinds)
		return row, "", c.refuseUndo(ctx, s, studentv1.ReasonRowReleased, msg,
			fmt.Errorf("row %s was released and is past the bound of rows taken back: %w", row.UID, registry.ErrNotOwned))
	}
	taken, err := c.write.takeBack(ctx, want, registry.CauseTakenBack)
	if err != nil {
		c.giveUndoBack()
	}
	switch {
	case errors.Is(err, registry.ErrNotOwned), errors.Is(err, registry.ErrObserved):
		return row, "", c.ownedElsewhere(ctx, s, err)
	case errors.Is(err, ErrNotLeading):
		return row, "", err
	case err != nil:
		return row, "", c.registryFailed(ctx, s, err)
	}
	c.cfg.Metrics.observeRow(rowRestored)
	c.cfg.Metrics.observeUndone(undoneTakenBack)
	msg := fmt.Sprintf("The registry row was released by this controller (%s) at %s while this Student still exists "+
		"(an etcd restore, or a Student missing for a while): it is this Student's again and written: %s, %s",
		cmp.Or(row.ReleaseCause, "unknown cause"), row.ReleasedAt.Format(time.RFC3339), taken.StudentName, taken.School)
	c.write.warn(s, EventRowTakenBack, msg)
	klog.FromContext(ctx).Info("Took back a registry row this controller had released", "releaseCause", row.ReleaseCause,
		"releasedAt", row.ReleasedAt)
	return taken, "", nil
}

// mayRecreate decides whether a missing row of a live Student may be written again,
// when its history says it was deleted: a finalizer of this Student ran, so the
// cluster this controller watches went back in time (an etcd restore) or is a clone
// of one that went on (a snapshot restored elsewhere, which takes the fence while
// production's controller restarts). Writing it again undoes production's past, so it
// counts against Config.MaxRewinds with the rows rewound and taken back: the history
// row of the delete is returned with one undo taken, which the caller gives back if
// its write fails. Past the bound the Student says so (RowDeleted) and nothing is
// written. A row missing for any other reason (deleted by hand, a backup without it)
// is restored as before: nil, nil.
func (c *Controller) mayRecreate(ctx context.Context, s *studentv1.Student) (*registry.HistoryEntry, error) {
	last, ok, err := c.rows.LastHistory(ctx, s.Namespace, s.Name, RowUID(s))
	switch {
	case err != nil:
		return nil, c.registryFailed(ctx, s, err)
	case !ok || last.Action != registry.ActionDeleted:
		return nil, nil
	}
	if !c.takeUndo() {
		msg := fmt.Sprintf("The registry row of this Student was deleted at %s (%s, by %s), and this controller has undone %d "+
			"rows since it started, its bound (--registry-max-rewinds): so many looks like a clone of the cluster, or a cluster "+
			"gone back in time, writing to production's registry. Nothing was written. If this cluster is the one the registry "+
			"follows, restart the controller with a higher --registry-max-rewinds",
			last.At.Format(time.RFC3339), last.Cause, last.Actor, c.cfg.MaxRewinds)
		return nil, c.refuseUndo(ctx, s, studentv1.ReasonRowDeleted, msg,
			fmt.Errorf("row %s was deleted (%s) and is past the bound of rows undone", s.UID, last.Cause))
	}
	return &last, nil
}

// takeUndo takes one of the Config.MaxRewinds undos for a write about to be made; it
// takes none and returns false once all are taken. Workers sync in parallel: a check
// before the write and a count after it would let each of them pass the last undo.
func (c *Controller) takeUndo() bool {
	for {
		n := c.rewound.Load()
		if n >= int64(c.cfg.MaxRewinds) {
			return false
		}
		if c.rewound.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// giveUndoBack returns an undo that takeUndo took for a write that failed.
func (c *Controller) giveUndoBack() { c.rewound.Add(-1) }

// refuseRewind reports a row ahead that this controller does not take back: it has
// taken back Config.MaxRewinds rows since it started. So many rows ahead of their
// Students looks less like an etcd restore than like a clone of the cluster (an etcd
// snapshot restored elsewhere, with the same identity) that writes to production's
// registry, whose Students are the older ones. Retrying cannot change that; a restart
// with a higher bound does, once an operator has checked.
func (c *Controller) refuseRewind(ctx context.Context, s *studentv1.Student, row, want registry.Record) error {
	msg := fmt.Sprintf("The registry row holds generation %d, newer than this Student's %d, and this controller has taken back "+
		"%d rows since it started, its bound (--registry-max-rewinds): so many rows ahead looks like a cloned cluster that shares "+
		"production's registry rather than an etcd restore. Nothing was written. If this cluster is the one the registry follows, "+
		"restart the controller with a higher --registry-max-rewinds", row.Generation, want.Generation, c.cfg.MaxRewinds)
	return c.refuseUndo(ctx, s, studentv1.ReasonRegistryAhead, msg,
		fmt.Errorf("row %s is ahead of its Student and past the bound of rows taken back: %w", row.UID, registry.ErrStale))
}

// refuseUndo reports a row not undone because Config.MaxRewinds is reached: the
// Student not Ready with reason and msg, a Warning of the same reason once per change
// of status, the refusal counted; it returns cause as terminal (a restart with a
// higher bound, not a retry, changes it).
func (c *Controller) refuseUndo(ctx context.Context, s *studentv1.Student, reason, msg string, cause error) error {
	changed, err := c.updateStatus(ctx, s, notReady(reason, msg), s.Status.Registry)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if changed {
		c.write.warn(s, reason, msg)
	}
	c.cfg.Metrics.observeRewriteRefused()
	return terminal(cause)
}
