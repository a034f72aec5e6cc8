package controller

import (
	"context"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/student-controller/student-controller/internal/decide"
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// Event reasons (decide posts the others).
const (
	EventRegistryError = decide.EventRegistryError
	EventRowUpdated    = decide.EventRowUpdated
	EventSweepRefused  = "SweepRefused"
)

// sync brings the registry in line with one Student: observe, decide (decide.Decide),
// apply, then write the status once. It is level-based: it reads the cache, whatever event
// brought the key, and is safe to repeat.
func (c *Controller) sync(ctx context.Context, key string) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return terminal(err)
	}
	cached, ok := c.students.get(namespace, name)
	if !ok {
		// Gone: its finalizer saw to its row, or the sweep will.
		c.states.forget(key)
		return nil
	}
	// A new object, with the fields the cache keeps: the sync may change it.
	s := cached.student()
	ctx = klog.NewContext(ctx, klog.LoggerWithValues(klog.FromContext(ctx), "student", klog.KObj(s), "uid", s.UID))
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(AttrUID.String(string(s.UID)), AttrGeneration.Int64(s.Generation))
	}
	if token := reconcileRequest(s); token != "" {
		// Every sync checks the row in the registry; this one was asked for.
		klog.FromContext(ctx).V(2).Info("Reconcile requested", "token", token)
	}
	f := c.facts(s)
	if !(f.Student.Paused && (!f.Student.Deleting || f.Student.Finalizer)) {
		c.states.unpaused(key)
		if f.Student.Deleting {
			c.states.forget(key)
		}
	}
	return c.syncFacts(ctx, s, f)
}

// facts are what a sync knows before it reads anything: the Student, from the cache.
func (c *Controller) facts(s *studentv1.Student) decide.Facts {
	f := studentFacts(c.cfg.Owner, s)
	f.UndoLeft, f.MaxUndo = c.rewound.Load() < int64(c.cfg.MaxRewinds), c.cfg.MaxRewinds
	// The CRD defaults spec.management: without it, the Student was read through an older
	// CRD (the cache may still hold it). A finalizer still asks if the CRD is deleting.
	f.CRDOlder = c.crd.Older() != nil || c.crd != nil && s.Spec.Management == ""
	f.RegistryBehind = f.Student.Deleting && c.registryBehind() != nil
	return f
}

// registryBehind is Config.Mark's word: nil when no mark is kept.
func (c *Controller) registryBehind() error {
	if c.cfg.Mark == nil {
		return nil
	}
	return c.cfg.Mark.Behind()
}

// CRDOlder is a *CRDTooOldError while the served Student CRD is older than this
// controller: it writes nothing for a live Student meanwhile, and is not ready.
func (c *Controller) CRDOlder() error { return c.crd.Older() }

func (c *Controller) syncAll() {
	for _, s := range c.students.list() {
		c.queue.Add(s.key)
	}
}

// studentFacts are the facts of s for owner alone: what sync and plan know before any read.
func studentFacts(owner string, s *studentv1.Student) decide.Facts {
	return decide.Facts{Owner: owner, Student: decide.Student{
		Namespace: s.Namespace, Name: s.Name, UID: string(s.UID), Generation: s.Generation, Spec: s.Spec, RowKey: RowUID(s),
		Deleting: s.DeletionTimestamp != nil, Finalizer: slices.Contains(s.Finalizers, Finalizer), Paused: paused(s),
		Written: wasWritten(s), Drifted: isDrifted(s),
	}}
}

// maxApplies bounds how often one sync decides again on what a write found.
const maxApplies = 4

// syncFacts decides and applies for s, and decides again when a write finds a new fact.
func (c *Controller) syncFacts(ctx context.Context, s *studentv1.Student, f decide.Facts) error {
	for range maxApplies {
		d, err := decide.Settle(&f, func(a decide.Ask, f *decide.Facts) error { return c.answer(ctx, s, a, f) })
		if err != nil {
			return c.failed(ctx, s, err)
		}
		var row registry.Record
		s, row, err = c.apply(ctx, s, &f, d.Actions)
		switch {
		case errors.Is(err, errNewFact):
			f.Row.Read = decide.Unread
			continue
		case err != nil:
			return c.failed(ctx, s, err)
		}
		return c.report(ctx, s, f, d, row)
	}
	return fmt.Errorf("the row changed under %d writes in a row; retrying", maxApplies)
}

func (c *Controller) answer(ctx context.Context, s *studentv1.Student, a decide.Ask, f *decide.Facts) error {
	switch a {
	case decide.AskRow:
		rec, err := c.rows.Get(ctx, f.Student.RowKey)
		f.Row.Read, f.Row.Record = decide.Found, rec
		switch {
		case errors.Is(err, registry.ErrNotFound):
			f.Row.Read = decide.Absent
		case errors.Is(err, registry.ErrMalformed):
			f.Row.Read = decide.Malformed
			klog.FromContext(ctx).Info("The registry row cannot be read", "err", err)
		case err != nil:
			return registryError{err}
		}
	case decide.AskQuorum:
		live, err := c.liveStudent(ctx, s.Namespace, s.Name, s.UID)
		switch {
		case err != nil:
			return fmt.Errorf("confirm the Student with the API server before writing its row: %w", err)
		case live == nil:
			klog.FromContext(ctx).V(2).Info("The Student is gone: this cache is behind, nothing to write")
			f.Quorum = decide.QuorumGone
		case live.ResourceVersion != s.ResourceVersion:
			f.Quorum = decide.QuorumChanged
		default:
			f.Quorum = decide.QuorumCurrent
		}
	case decide.AskHistory:
		last, ok, err := c.rows.LastHistory(ctx, s.Namespace, s.Name, f.Student.RowKey)
		if err != nil {
			return registryError{err}
		}
		f.History, f.Deleted = decide.HistoryOf(f.Owner, last, ok), last
	case decide.AskCRD:
		crd, err := c.crdState(ctx)
		if err != nil {
			return registryError{err}
		}
		f.CRD = crd
	default:
		return fmt.Errorf("the decision asked for an unknown fact %d", a)
	}
	return nil
}

// registryError is a failure of the registry or of a finalizer's read; status reports it.
type registryError struct{ err error }

func (e registryError) Error() string { return e.err.Error() }
func (e registryError) Unwrap() error { return e.err }

func wasWritten(s *studentv1.Student) bool {
	return s.Status.Registry != nil && s.Status.Registry.LastWrittenTime != nil
}

// liveStudent gets Student namespace/name of uid: nil, nil if it is gone or replaced.
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

// crdState asks Config.CRDDeleting, if set, whether the Student CRD is being deleted.
func (c *Controller) crdState(ctx context.Context) (decide.CRD, error) {
	if c.cfg.CRDDeleting == nil {
		return decide.CRDCurrent, nil
	}
	switch deleting, err := c.cfg.CRDDeleting(ctx); {
	case err != nil:
		return decide.CRDUnasked, fmt.Errorf("ask whether the Student CRD is being deleted: %w", err)
	case deleting:
		return decide.CRDDeleting, nil
	}
	return decide.CRDCurrent, nil
}
