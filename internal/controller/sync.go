package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/student-controller/student-controller/internal/decide"
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// Event reasons, for `kubectl describe` and `kubectl get events`. An Event is an API
// request, so Normal Events are kept for what changes a Student's row after it was first
// written; the routine first write and the final delete or release are in status, the
// rows-written metric and the log (-v=2), and cost no request. Warnings are sent once
// per change of the Student's status, not on every retry.
const (
	EventRowUpdated        = decide.EventRowUpdated
	EventRowRestored       = decide.EventRowRestored
	EventRegistryError     = decide.EventRegistryError
	EventRowOwnedElsewhere = decide.EventRowOwnedElsewhere
	EventRowNotBound       = decide.EventRowNotBound
	EventInvalidSpec       = decide.EventInvalidSpec
	EventSweepRefused      = "SweepRefused"
	EventRegistryAhead     = decide.EventRegistryAhead
	EventRowTakenBack      = decide.EventRowTakenBack
	EventRowRecreated      = decide.EventRowRecreated
)

// sync brings the registry in line with one Student. It is level-based: it reads the
// object from the cache, whatever event brought the key, and is safe to repeat.
func (c *Controller) sync(ctx context.Context, key string) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return terminal(err)
	}
	cached, ok := c.students.get(namespace, name)
	if !ok {
		// Gone: its finalizer saw to its row, or the sweep will.
		c.cfg.Metrics.forget(key)
		return nil
	}
	// A new object, with the fields the cache keeps: the sync may change it.
	student := cached.student()
	ctx = klog.NewContext(ctx, klog.LoggerWithValues(klog.FromContext(ctx), "student", klog.KObj(student), "uid", student.UID))
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(AttrUID.String(string(student.UID)), AttrGeneration.Int64(student.Generation))
	}
	if paused(student) && (student.DeletionTimestamp == nil || slices.Contains(student.Finalizers, Finalizer)) {
		return c.holdPaused(ctx, student)
	}
	c.cfg.Metrics.observeUnpaused(key)
	if token := reconcileRequest(student); token != "" {
		// Every sync checks the row in the registry; this one was asked for.
		klog.FromContext(ctx).V(2).Info("Reconcile requested", "token", token)
	}
	if student.DeletionTimestamp != nil {
		c.cfg.Metrics.forget(key)
		return c.finalize(ctx, student)
	}
	return c.reconcile(ctx, student)
}

// reconcile brings the registry row of a live Student in line with its spec, in three
// steps: the finalizer, the row, the report (status, and an Event for a change). A
// Student already in line costs no write at all.
func (c *Controller) reconcile(ctx context.Context, s *studentv1.Student) error {
	if problem := s.Spec.Validate(); problem != "" {
		return c.refuseSpec(ctx, s, problem)
	}
	if problem, err := c.rowNotBound(ctx, s, !observed(s.Spec)); err != nil {
		return c.registryFailed(ctx, s, err)
	} else if problem != "" {
		return c.refuseUnbound(ctx, s, problem)
	}
	if observed(s.Spec) {
		return c.observe(ctx, s)
	}
	s, err := c.ensureFinalizer(ctx, s)
	if err != nil {
		return err
	}
	row, action, err := c.ensureRow(ctx, s)
	if errors.Is(err, errStudentGone) {
		return nil // the cache was behind: nothing to write, nothing to report on
	}
	if err != nil {
		return err
	}
	return c.report(ctx, s, row, action)
}

// errStudentGone: the API server no longer has the Student that the cache holds.
var errStudentGone = errors.New("the Student is gone from the API server")

// refuseSpec reports a spec the registry must not take. Retrying cannot help; a change
// to the Student brings it back.
func (c *Controller) refuseSpec(ctx context.Context, s *studentv1.Student, problem string) error {
	changed, err := c.updateStatus(ctx, s, notReady(studentv1.ReasonInvalidSpec, problem), s.Status.Registry)
	if err != nil {
		return err
	}
	if changed {
		c.write.warn(s, EventInvalidSpec, problem)
	}
	return terminal(fmt.Errorf("invalid spec: %s", problem))
}

// ensureFinalizer puts the finalizer on the Student before its row can exist, unless
// it is there already (the admission policy adds it on create).
func (c *Controller) ensureFinalizer(ctx context.Context, s *studentv1.Student) (*studentv1.Student, error) {
	if slices.Contains(s.Finalizers, Finalizer) {
		return s, nil
	}
	s.Finalizers = append(s.Finalizers, Finalizer)
	updated, err := c.write.setFinalizers(ctx, s)
	if err != nil {
		return nil, fmt.Errorf("add finalizer: %w", err)
	}
	return updated, nil
}

// ensureRow writes the Student's row when it is missing, unreadable or differs from
// the spec, and returns the row with what was done to it ("" for nothing). A failure
// it returns has been reported on the Student.
func (c *Controller) ensureRow(ctx context.Context, s *studentv1.Student) (registry.Record, string, error) {
	want := recordOf(c.cfg.Owner, s)
	if !wasWritten(s) {
		// A new Student, whose row is almost always absent: Insert writes it without
		// the read first. A row there after all (written by a sync that ended before
		// its status, another owner's, a released or unreadable one) is left as it is,
		// and read and judged below like any other.
		row, err := c.write.insert(ctx, want, registry.CauseNewStudent)
		switch {
		case err == nil:
			return c.wroteRow(ctx, row, registry.Why{Action: rowCreated, Cause: registry.CauseNewStudent})
		case errors.Is(err, ErrNotLeading):
			return row, "", err
		case !errors.Is(err, registry.ErrExists):
			return row, "", c.registryFailed(ctx, s, err)
		}
	}
	row, err := c.rows.Get(ctx, want.UID)
	exists, malformed := err == nil, errors.Is(err, registry.ErrMalformed)
	switch {
	case errors.Is(err, registry.ErrNotFound):
	case malformed:
		// Another writer got past the schema: the upsert rewrites the row if it is ours.
		exists = true
		klog.FromContext(ctx).Info("Rewriting a registry row that cannot be read", "err", err)
	case err != nil:
		return row, "", c.registryFailed(ctx, s, err)
	case decide.TakenBack(row, c.cfg.Owner):
		return c.takeBack(ctx, s, want, row)
	case row.Owner != c.cfg.Owner:
		return row, "", c.ownedElsewhere(ctx, s, fmt.Errorf("row %s is %s: %w", row.UID, decide.OwnedBy(row), registry.ErrNotOwned))
	}

	if exists && !malformed && row.DeletionPolicy == "" {
		// Written before rows recorded their policy: recording it is no change to the
		// student's record (no Event, updated_at kept).
		if err := c.write.recordPolicy(ctx, want.UID, want.Owner, want.DeletionPolicy); err != nil {
			return row, "", c.registryFailed(ctx, s, err)
		}
		row.DeletionPolicy = want.DeletionPolicy
	}
	why, write := decide.RowWrite(row, want, exists, malformed, wasWritten(s))
	if !write {
		return row, "", nil
	}
	// A row it observed until now holds values that may be another system's: the
	// history keeps them before this write overwrites them.
	why.KeepObserved = exists && (malformed || row.Management == registry.ManagementObserve)
	var recreate *registry.HistoryEntry
	if why.Action == rowRestored {
		// The row went missing after it was written. Drift, or this cache is behind
		// the API server: a replica that has just taken the lead with a watch that
		// was cut may still hold a Student the previous leader finalized, its row
		// deleted. Restoring that row would bring it back, at an older generation.
		if live, err := c.confirmCurrent(ctx, s); live == nil {
			return row, "", cmp.Or(err, errStudentGone)
		}
		if recreate, err = c.mayRecreate(ctx, s); err != nil {
			return row, "", err
		}
	}
	row, err = c.write.upsert(ctx, want, why)
	ahead := errors.Is(err, registry.ErrStale)
	if recreate != nil && err != nil {
		c.giveUndoBack() // not written again (a row ahead is registryAhead's to count)
		recreate = nil
	}
	if ahead {
		row, err = c.registryAhead(ctx, s, want)
	}
	switch {
	case errors.Is(err, registry.ErrNotOwned):
		return row, "", c.ownedElsewhere(ctx, s, err)
	case errors.Is(err, registry.ErrStale), errors.Is(err, ErrNotLeading), errors.Is(err, errCacheBehind), errors.Is(err, errStudentGone):
		// This cache is behind the API server or a newer writer's: nothing to write,
		// and the watch brings the newer Student. (Or a row ahead that refuseRewind
		// reported: terminal.)
		return row, "", err
	case err != nil:
		return row, "", c.registryFailed(ctx, s, err)
	case ahead:
		// Reported by registryAhead's Warning, not by a second Event.
		c.cfg.Metrics.observeRow(rowUpdated)
		return row, "", nil
	case recreate != nil:
		c.cfg.Metrics.observeUndone(undoneRecreated)
		c.write.warn(s, EventRowRecreated, fmt.Sprintf("The registry row of this Student was deleted at %s (%s, by %s) while "+
			"the Student is live here: the cluster went back in time or is a clone. The row is written again from the Student",
			recreate.At.Format(time.RFC3339), recreate.Cause, recreate.Actor))
	}
	return c.wroteRow(ctx, row, why)
}

// wroteRow counts and logs a row that ensureRow wrote, and returns what it returns.
func (c *Controller) wroteRow(ctx context.Context, row registry.Record, why registry.Why) (registry.Record, string, error) {
	c.cfg.Metrics.observeRow(why.Action)
	klog.FromContext(ctx).V(2).Info("Wrote registry row", "action", why.Action, "cause", why.Cause, "generation", row.Generation)
	return row, why.Action, nil
}

// report writes the Student's status from its row, and an Event when the row was
// changed or restored. A status write that finds the Student gone undoes the row
// write: the cache was behind.
func (c *Controller) report(ctx context.Context, s *studentv1.Student, row registry.Record, action string) error {
	if _, err := c.updateStatus(ctx, s, ready(), registryStatus(row)); err != nil {
		if apierrors.IsNotFound(err) {
			return c.undoStaleWrite(ctx, s)
		}
		if action == rowCreated {
			// Whether the Student is gone must be known now: if it is, the retry finds
			// no Student in the cache and leaves the row to the next sweep.
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
	c.cfg.Metrics.observeReported(cache.MetaObjectToName(s).String(), s.Generation, c.clock.Now())
	switch action {
	case rowUpdated:
		c.write.event(s, corev1.EventTypeNormal, EventRowUpdated, fmt.Sprintf("Registry row written: %s, %s", row.StudentName, row.School))
	case rowRestored:
		c.write.event(s, corev1.EventTypeNormal, EventRowRestored, fmt.Sprintf("Registry row was missing and is written again: %s, %s", row.StudentName, row.School))
	}
	return nil
}

// errCacheBehind: the API server holds a newer version of the Student than the cache;
// the sync waits for the watch to bring it (retried).
var errCacheBehind = errors.New("the cache is behind the API server for this Student")

// wasWritten tells whether the Student's status says its row was written before.
func wasWritten(s *studentv1.Student) bool {
	return s.Status.Registry != nil && s.Status.Registry.LastWrittenTime != nil
}

// confirmCurrent asks the API server (a quorum read) whether it holds the version of
// the Student that the cache does, and returns it if so. If not, the sync writes
// nothing: a Student gone (or replaced) ends it (nil, and no error), one changed since
// is retried (errCacheBehind) once the watch brings the change.
func (c *Controller) confirmCurrent(ctx context.Context, s *studentv1.Student) (*studentv1.Student, error) {
	live, err := c.liveStudent(ctx, s.Namespace, s.Name, s.UID)
	switch {
	case err == nil && live == nil:
		klog.FromContext(ctx).V(2).Info("The Student is gone: this cache is behind, nothing to write")
		c.cfg.Metrics.forget(cache.MetaObjectToName(s).String())
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("confirm the Student with the API server before writing its row: %w", err)
	case live.ResourceVersion != s.ResourceVersion:
		return nil, errCacheBehind
	}
	return live, nil
}

// liveStudent asks the API server for the Student namespace/name of uid: nil, and no
// error, when it is gone or another Student of that name stands in its place.
func (c *Controller) liveStudent(ctx context.Context, namespace, name string, uid types.UID) (*studentv1.Student, error) {
	live, err := c.getStudent(ctx, namespace, name)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	case live.UID != uid:
		return nil, nil
	}
	return live, nil
}

// observeLetGo counts a row that Delete or Relinquish deleted or released; absent
// says its Student was not found (no finalizer ran for it).
func (c *Controller) observeLetGo(outcome registry.Outcome, absent bool) {
	switch outcome {
	case registry.Deleted:
		c.cfg.Metrics.observeRow(rowDeleted)
	case registry.Released:
		c.cfg.Metrics.observeRow(rowReleased)
		if absent {
			c.cfg.Metrics.observeReleasedAbsent()
		}
	}
}

// undoStaleWrite lets go of the row of a Student that the API server no longer has,
// when the status write that follows a row write (action) finds it gone. This cache
// was behind: a replica that has just taken the lead, or whose watch was cut, can
// still hold a Student that the previous leader finalized, its row deleted; the sync
// then wrote the row again. Left there, it would be an owned row without a Student.
// It is released, since absence destroys nothing (registry prune deletes it, when
// asked, if its policy is Delete). A row already released stays.
func (c *Controller) undoStaleWrite(ctx context.Context, s *studentv1.Student) error {
	outcome, err := c.write.relinquish(ctx, RowUID(s), c.cfg.Owner, registry.CauseStaleCache)
	if err != nil && !errors.Is(err, registry.ErrNotOwned) && !errors.Is(err, registry.ErrObserved) {
		return fmt.Errorf("the Student is gone; let go of the row this sync wrote from a stale cache: %w", err)
	}
	c.observeLetGo(outcome, true)
	if outcome != registry.Absent {
		klog.FromContext(ctx).Info("The Student was gone when its status was written: let go of the row written from a cache that was behind", "action", outcome)
	}
	return nil
}

// finalize deletes or releases the row of a Student being deleted, per its
// deletionPolicy, then lets the Student go. While the registry fails, the Student
// stays Terminating: a delete is never lost.
func (c *Controller) finalize(ctx context.Context, s *studentv1.Student) error {
	if !slices.Contains(s.Finalizers, Finalizer) {
		return nil
	}
	logger := klog.FromContext(ctx)
	if problem, err := c.rowNotBound(ctx, s, false); err != nil {
		return c.registryFailed(ctx, s, err)
	} else if problem != "" {
		// The row is another Student's, or nobody's: not this one's to let go.
		c.write.warn(s, EventRowNotBound, "Registry row left alone: "+problem)
		return c.removeFinalizer(ctx, s)
	}

	uid := RowUID(s)
	var done bool
	var err error
	var outcome registry.Outcome
	action := rowDeleted
	if observed(s.Spec) {
		if err := c.finalizeObserved(ctx, s); err != nil {
			return err
		}
		return c.removeFinalizer(ctx, s)
	}
	switch s.Spec.DeletionPolicy {
	case studentv1.DeletionPolicyOrphan:
		action = rowReleased
		done, err = c.release(ctx, s)
	case "", studentv1.DeletionPolicyDelete:
		// Deleted only if the row records Delete too; a row that says otherwise (an
		// older backup put back) is released as it stands. A Student deleted with its
		// CRD was not deleted by a user: absence, so its row is released.
		var withCRD bool
		if withCRD, err = c.crdDeleting(ctx); err != nil {
			return c.registryFailed(ctx, s, err)
		}
		if withCRD {
			outcome, err = c.write.relinquish(ctx, uid, c.cfg.Owner, registry.CauseCRDDeleted)
			if outcome == registry.Released {
				c.cfg.Metrics.observeReleasedAbsent()
			}
		} else {
			outcome, err = c.write.delete(ctx, uid, c.cfg.Owner, registry.CauseFinalizer)
		}
		done = outcome != registry.Absent
		if outcome == registry.Released {
			action = rowReleased
		}
	default:
		// A policy the CRD refuses now, stored before it did ("orphan", "Retain"):
		// whatever was meant, keeping the row is what can be undone.
		action = rowReleased
		done, err = c.release(ctx, s)
	}
	if errors.Is(err, registry.ErrStale) {
		// The row is ahead of the Student (an etcd restore): it follows the Student
		// first, then goes as the Student's policy says.
		if _, err = c.registryAhead(ctx, s, recordOf(c.cfg.Owner, s)); err == nil {
			done, err = c.release(ctx, s)
		}
	}
	switch {
	case errors.Is(err, errStudentGone):
		return nil // its finalizer is gone with it
	case errors.Is(err, errCacheBehind):
		return err
	case errors.Is(err, registry.ErrStale), errors.Is(err, ErrNotLeading):
		return err // as in ensureRow
	case errors.Is(err, registry.ErrNotOwned), errors.Is(err, registry.ErrObserved):
		// Not ours to touch: the Student may go, the row stays as its owner left it.
		c.write.warn(s, EventRowOwnedElsewhere, fmt.Sprintf("Registry row left alone: %v", err))
	case err != nil:
		return c.registryFailed(ctx, s, err)
	case done:
		c.cfg.Metrics.observeRow(action)
		logger.V(2).Info("Registry row gone from this controller", "action", action, "deletionPolicy", policy(s))
	}

	return c.removeFinalizer(ctx, s)
}

// crdDeleting asks Config.CRDDeleting, if set.
func (c *Controller) crdDeleting(ctx context.Context) (bool, error) {
	if c.cfg.CRDDeleting == nil {
		return false, nil
	}
	deleting, err := c.cfg.CRDDeleting(ctx)
	if err != nil {
		return false, fmt.Errorf("ask whether the Student CRD is being deleted: %w", err)
	}
	return deleting, nil
}

// removeFinalizer lets a Student being deleted go, once its row is seen to.
func (c *Controller) removeFinalizer(ctx context.Context, s *studentv1.Student) error {
	s.Finalizers = slices.DeleteFunc(s.Finalizers, func(f string) bool { return f == Finalizer })
	if _, err := c.write.setFinalizers(ctx, s); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer: %w", err)
	}
	return nil
}

// release releases the row of an Orphan Student being deleted, with its last spec;
// a spec that the registry cannot hold (stored before the CRD refused it) leaves the
// row's values as they were last written, so that the deletion still finishes.
func (c *Controller) release(ctx context.Context, s *studentv1.Student) (bool, error) {
	rec := recordOf(c.cfg.Owner, s)
	if s.Spec.Validate() != "" {
		stored, err := c.rows.Get(ctx, rec.UID)
		if errors.Is(err, registry.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		rec.StudentName, rec.School, rec.Generation = stored.StudentName, stored.School, stored.Generation
	}
	return c.write.release(ctx, rec, registry.CauseFinalizer)
}

// registryFailed reports a registry failure on the Student and returns it for retry.
// Status and Events, which every tenant reads, get a fixed message; the cause (hosts,
// users, database and file names) goes only to the controller's log, with the error.
func (c *Controller) registryFailed(ctx context.Context, s *studentv1.Student, cause error) error {
	if errors.Is(cause, registry.ErrFenced) || errors.Is(cause, ErrNotLeading) {
		// Not a registry failure: another controller writes now, and this one stops;
		// the Student is that one's to report on.
		return cause
	}
	msg := "The registry did not answer or refused the write; the controller retries (its log has the cause)"
	if s.DeletionTimestamp != nil {
		msg = "Waiting for the registry to let the row go; the controller retries (its log has the cause)"
	}
	changed, err := c.updateStatus(ctx, s, notReady(studentv1.ReasonRegistryUnavailable, msg), s.Status.Registry)
	if err != nil && !apierrors.IsNotFound(err) {
		return errors.Join(cause, err)
	}
	if changed {
		// Once per outage and Student: the retries with backoff that find status
		// already saying so send nothing.
		c.write.warn(s, EventRegistryError, msg)
	}
	return fmt.Errorf("registry: %w", cause)
}

// ownedElsewhere reports that the row belongs to someone else. Retrying cannot change
// that; the controller never takes a row over.
func (c *Controller) ownedElsewhere(ctx context.Context, s *studentv1.Student, cause error) error {
	msg := "The registry row belongs to another owner and is left alone: " + cause.Error() + ". If that owner's rows are to " +
		"follow this controller, stop its controllers and run student-controller registry rename-owner; a row it released " +
		"can be bound to a new Student with student-controller registry adopt"
	changed, err := c.updateStatus(ctx, s, notReady(studentv1.ReasonRowOwnedElsewhere, msg), nil)
	if err != nil {
		return err
	}
	if changed {
		c.write.warn(s, EventRowOwnedElsewhere, msg)
	}
	return terminal(cause)
}

// recordOf is the registry row that a Student should have, written by owner.
func recordOf(owner string, s *studentv1.Student) registry.Record {
	return newRecord(owner, RowUID(s), s.UID, s.Namespace, s.Name, s.Generation, s.Spec)
}

// newRecord is the registry row of key row of the Student namespace/name of uid,
// generation and spec, written by owner.
func newRecord(owner, row string, uid types.UID, namespace, name string, generation int64, spec studentv1.StudentSpec) registry.Record {
	return decide.Want(owner, decide.Student{Namespace: namespace, Name: name, UID: string(uid), Generation: generation, Spec: spec, RowKey: row})
}

func policy(s *studentv1.Student) studentv1.DeletionPolicy { return decide.SpecPolicy(s.Spec) }
