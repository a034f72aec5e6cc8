package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/student-controller/student-controller/internal/decide"
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// errNewFact: a write found a fact the decision did not have; decide again.
var errNewFact = errors.New("a write found a new fact")

// errCacheBehind: the API server has a newer Student than the cache; retried.
var errCacheBehind = errors.New("the cache is behind the API server for this Student")

// apply runs the actions in order. It returns the Student and row as last written (or the
// row as found), and errNewFact, with the fact set in f, when a write needs a new decision.
func (c *Controller) apply(ctx context.Context, s *studentv1.Student, f *decide.Facts, actions []decide.Action) (*studentv1.Student, registry.Record, error) {
	row := f.Row.Record
	for _, a := range actions {
		if a.Undo && !c.takeUndo() {
			f.UndoLeft = false
			return s, row, errNewFact
		}
		written, err := c.do(ctx, s, a)
		if a.Undo && err != nil {
			c.giveUndoBack()
		}
		switch {
		case err == nil:
		case a.Op == decide.MarkObserved && errors.Is(err, registry.ErrNotOwned):
			// Not this owner's to mark: nothing to keep from letting go.
			continue
		case errors.Is(err, registry.ErrExists):
			f.Row.Exists = true
			return s, row, errNewFact
		case errors.Is(err, registry.ErrStale):
			f.Row.Stale = true
			return s, row, errNewFact
		case a.Op == decide.Rebind && errors.Is(err, registry.ErrNotFound):
			return s, row, errNewFact // the row went since it was read
		case errors.Is(err, registry.ErrNotOwned), errors.Is(err, registry.ErrObserved):
			f.Row.Refused = err.Error()
			return s, row, errNewFact
		default:
			return s, row, err
		}
		switch a.Op {
		case decide.AddFinalizer:
			s, f.Student.Finalizer = written.student, true
		case decide.RemoveFinalizer:
		default:
			if written.wrote {
				row = written.row
			}
			c.observeWrite(ctx, a, written)
		}
	}
	return s, row, nil
}

// written is what one action's write returned.
type written struct {
	student *studentv1.Student
	row     registry.Record
	wrote   bool // row holds the row written
	outcome registry.Outcome
}

// do makes the write of one action. Registry failures come back as registryError.
func (c *Controller) do(ctx context.Context, s *studentv1.Student, a decide.Action) (written, error) {
	switch a.Op {
	case decide.AddFinalizer:
		s.Finalizers = append(s.Finalizers, Finalizer)
		updated, err := c.write.setFinalizers(ctx, s)
		if err != nil {
			return written{}, fmt.Errorf("add finalizer: %w", err)
		}
		return written{student: updated}, nil
	case decide.RemoveFinalizer:
		s.Finalizers = slices.DeleteFunc(s.Finalizers, func(f string) bool { return f == Finalizer })
		if _, err := c.write.setFinalizers(ctx, s); err != nil && !apierrors.IsNotFound(err) {
			return written{}, fmt.Errorf("remove finalizer: %w", err)
		}
		return written{}, nil
	}
	op, wrote := rowOp(c.cfg.Owner, a)
	res, err := c.write.apply(ctx, op)
	out := written{row: res.Record, wrote: wrote, outcome: res.Outcome}
	if a.Op == decide.Rebind {
		out.row = a.Record // bound as decide said: the row as it stands, with the binding
	}
	switch {
	case err == nil, errors.Is(err, ErrNotLeading), errors.Is(err, registry.ErrFenced), errors.Is(err, registry.ErrExists),
		errors.Is(err, registry.ErrStale), errors.Is(err, registry.ErrNotOwned), errors.Is(err, registry.ErrObserved):
		return out, err
	}
	return out, registryError{err}
}

var registryOps = map[decide.Op]registry.OpKind{
	decide.Insert: registry.OpInsert, decide.Upsert: registry.OpUpsert, decide.Rewind: registry.OpRewind,
	decide.TakeBack: registry.OpTakeBack, decide.MarkObserved: registry.OpMarkObserved, decide.RecordPolicy: registry.OpRecordPolicy,
	decide.Delete: registry.OpDelete, decide.Relinquish: registry.OpRelinquish, decide.Release: registry.OpRelease,
	decide.Rebind: registry.OpAdopt,
}

// rowOp is the registry write of a row action by owner, and whether it returns the row.
func rowOp(owner string, a decide.Action) (registry.Op, bool) {
	op := registry.Op{Kind: registryOps[a.Op], Record: a.Record, Why: a.Why, Ahead: a.Ahead}
	switch a.Op {
	case decide.Rebind:
		// The Student's uid goes into the row's binding; the row keeps its key.
		op.Row, op.Record.UID = a.Record.UID, a.Record.StudentUID
		return op, true
	case decide.MarkObserved, decide.RecordPolicy, decide.Delete, decide.Relinquish:
		op.Record.Owner = owner
		return op, false
	case decide.Release:
		return op, false
	}
	return op, true
}

func (c *Controller) observeWrite(ctx context.Context, a decide.Action, w written) {
	logger := klog.FromContext(ctx)
	switch a.Op {
	case decide.Insert, decide.Upsert:
		c.cfg.Metrics.rowsWritten.WithLabelValues(a.Why.Action).Inc()
		if a.Undo {
			c.cfg.Metrics.undone.WithLabelValues(undoneRecreated).Inc()
		}
		logger.V(2).Info("Wrote registry row", "action", a.Why.Action, "cause", a.Why.Cause, "generation", w.row.Generation)
	case decide.Rewind:
		c.cfg.Metrics.rowsWritten.WithLabelValues(rowUpdated).Inc()
		c.cfg.Metrics.registryAhead.Inc()
		logger.Info("Registry row was ahead of its Student; it follows the Student again", "rowGeneration", a.Ahead, "generation", a.Record.Generation)
	case decide.TakeBack:
		c.cfg.Metrics.rowsWritten.WithLabelValues(rowRestored).Inc()
		c.cfg.Metrics.undone.WithLabelValues(undoneTakenBack).Inc()
		logger.Info("Took back a registry row this controller had released")
	case decide.MarkObserved:
		logger.V(2).Info("Registry row marked observed: the controller no longer writes it")
	case decide.Rebind:
		logger.Info("Registry row had lost its binding to this Student; bound again", "row", a.Record.UID)
	case decide.Delete, decide.Relinquish, decide.Release:
		c.observeLetGo(w.outcome, a.Why.Cause == registry.CauseCRDDeleted)
		if w.outcome != registry.Absent {
			logger.V(2).Info("Registry row gone from this controller", "action", w.outcome, "cause", a.Why.Cause)
		}
	}
}

// observeLetGo counts a deleted or released row; absent: its Student was not found.
func (c *Controller) observeLetGo(outcome registry.Outcome, absent bool) {
	switch outcome {
	case registry.Deleted:
		c.cfg.Metrics.rowsWritten.WithLabelValues(rowDeleted).Inc()
	case registry.Released:
		c.cfg.Metrics.rowsWritten.WithLabelValues(rowReleased).Inc()
		if absent {
			c.cfg.Metrics.releasedAbsent.Inc()
		}
	}
}

// report writes the status if it changed, posts the Events, and returns the result.
func (c *Controller) report(ctx context.Context, s *studentv1.Student, f decide.Facts, d decide.Decision, row registry.Record) error {
	key := cache.MetaObjectToName(s).String()
	changed := false
	if d.Status != nil {
		var err error
		if changed, err = c.updateStatus(ctx, s, *d.Status, row); err != nil {
			return c.statusFailed(ctx, s, d, err)
		}
		if d.Status.Ready || d.Status.Drifted != nil {
			if took, ok := c.states.generations.reported(key, s.Generation, c.clock.Now()); ok {
				c.cfg.Metrics.syncLatency.Observe(took.Seconds())
			}
		}
	}
	for _, e := range d.Events {
		if e.OnChange && !changed {
			continue
		}
		kind := corev1.EventTypeNormal
		if e.Warning {
			kind = corev1.EventTypeWarning
		}
		c.write.event(s, kind, e.Reason, e.Message)
	}
	switch {
	case d.Result == decide.Terminal:
		if undoReason(d.Status) {
			c.cfg.Metrics.rewritesRefused.Inc()
		}
		return terminal(errors.New(d.Why))
	case d.Result == decide.Retry && f.Quorum == decide.QuorumChanged:
		return errCacheBehind
	case d.Result == decide.Retry:
		return errors.New(d.Why)
	case f.Quorum == decide.QuorumGone:
		c.states.forget(key)
	}
	return nil
}

// undoReason says whether status refuses an undo past the bound.
func undoReason(st *decide.Status) bool {
	return st != nil && (st.Reason == studentv1.ReasonRegistryAhead || st.Reason == studentv1.ReasonRowReleased || st.Reason == studentv1.ReasonRowDeleted)
}

// statusFailed handles a failed status write; a Student gone since has its new row let go.
func (c *Controller) statusFailed(ctx context.Context, s *studentv1.Student, d decide.Decision, err error) error {
	wrote, created := false, false
	for _, a := range d.Actions {
		switch a.Op {
		case decide.Insert, decide.Upsert, decide.Rewind, decide.TakeBack:
			wrote, created = true, created || a.Why.Action == registry.ActionCreated
		}
	}
	switch {
	case !wrote:
		if apierrors.IsNotFound(err) && d.Result == decide.Terminal {
			return nil
		}
		return err
	case apierrors.IsNotFound(errors.Unwrap(err)) || apierrors.IsNotFound(err):
		return c.undoStaleWrite(ctx, s)
	case created:
		// Whether the Student is gone must be known now: if it is, the retry finds no
		// Student in the cache and leaves the row to the next sweep.
		live, getErr := c.liveStudent(ctx, s.Namespace, s.Name, s.UID)
		if getErr != nil {
			return errors.Join(err, fmt.Errorf("ask whether the Student is gone: %w", getErr))
		}
		if live == nil {
			return c.undoStaleWrite(ctx, s)
		}
	}
	return err
}

// undoStaleWrite releases the row of a Student found gone after its row write: a new
// leader's cache can still hold a Student the old leader finalized, so the sync wrote its
// row again. Release destroys nothing; a released row stays.
func (c *Controller) undoStaleWrite(ctx context.Context, s *studentv1.Student) error {
	res, err := c.write.apply(ctx, registry.Op{Kind: registry.OpRelinquish, Record: registry.Record{UID: RowUID(s), Owner: c.cfg.Owner},
		Why: registry.Why{Cause: registry.CauseStaleCache}})
	if err != nil && !errors.Is(err, registry.ErrNotOwned) && !errors.Is(err, registry.ErrObserved) {
		return fmt.Errorf("the Student is gone; let go of the row this sync wrote from a stale cache: %w", err)
	}
	c.observeLetGo(res.Outcome, true)
	if res.Outcome != registry.Absent {
		klog.FromContext(ctx).Info("The Student was gone when its status was written: let go of the row written from a cache that was behind",
			"action", res.Outcome)
	}
	return nil
}

// failed reports a registry failure on the Student with a fixed message (hosts and file
// names go to the log only) and returns it for retry; other errors pass through.
func (c *Controller) failed(ctx context.Context, s *studentv1.Student, cause error) error {
	var reg registryError
	if !errors.As(cause, &reg) {
		return cause
	}
	status, event := decide.Unavailable(c.facts(s).Student)
	changed, err := c.updateStatus(ctx, s, status, registry.Record{})
	if err != nil && !apierrors.IsNotFound(err) {
		return errors.Join(cause, err)
	}
	if changed {
		// Once per outage and Student: retries that find the status saying so post nothing.
		c.write.warn(s, event.Reason, event.Message)
	}
	return fmt.Errorf("registry: %w", reg.err)
}

// Undoing production's past (rewinding a row ahead, taking back a released row, writing
// a deleted one again) is what an etcd restore calls for, but also what a cloned cluster
// would do to production: decide confirms each with the API server; takeUndo caps them.

// takeUndo takes one of the Config.MaxRewinds undos before a write; false once all are
// taken. Workers run in parallel: checking first and counting after the write would let
// each of them pass the last undo.
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
