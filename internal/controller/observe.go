package controller

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/student-controller/student-controller/internal/decide"
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// Event reasons of an observed Student: its row drifted from the spec, or came back in
// line. Each is sent once per change of the Drifted condition.
const (
	EventDrifted = decide.EventDrifted
	EventInLine  = decide.EventInLine
)

// observed says whether a Student only observes its row (spec.management: Observe).
func observed(spec studentv1.StudentSpec) bool {
	return spec.Management == studentv1.ManagementObserve
}

// observe is the sync of an observed Student: it reads the row, compares it with the
// spec and reports (the Drifted and Ready conditions, an Event when Drifted changes),
// and never writes the row. The one registry write it makes is a mark, once: a row
// this controller managed until now is marked observed, so that no path that finds it
// without its Student (the sweep after a deletion) lets it go.
func (c *Controller) observe(ctx context.Context, s *studentv1.Student) error {
	row, err := c.rows.Get(ctx, RowUID(s))
	found, malformed := err == nil, errors.Is(err, registry.ErrMalformed)
	if err != nil && !malformed && !errors.Is(err, registry.ErrNotFound) {
		return c.registryFailed(ctx, s, err)
	}
	if found && row.Owner == c.cfg.Owner && row.Management != registry.ManagementObserve {
		if err := c.write.markObserved(ctx, row.UID, c.cfg.Owner); err != nil && !errors.Is(err, registry.ErrNotOwned) {
			return c.registryFailed(ctx, s, err)
		}
		klog.FromContext(ctx).V(2).Info("Registry row marked observed: the controller no longer writes it")
	}
	differs := decide.Drift(row, found, malformed, s.Namespace, s.Name, s.Spec)
	return c.reportObserved(ctx, s, differs)
}

// reportObserved writes an observed Student's status: Drifted True (with what
// differs) or False, Ready False or True to match, and an Event when Drifted changed.
func (c *Controller) reportObserved(ctx context.Context, s *studentv1.Student, differs string) error {
	key := cache.MetaObjectToName(s).String()
	was := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionDrifted)
	wasDrifted := was != nil && was.Status == metav1.ConditionTrue
	ready := metav1.Condition{Type: studentv1.ConditionReady, Status: metav1.ConditionTrue, Reason: studentv1.ReasonInLine,
		Message: "The registry row matches the spec; the Student is observed, so the controller does not write it"}
	drifted := metav1.Condition{Type: studentv1.ConditionDrifted, Status: metav1.ConditionFalse, Reason: studentv1.ReasonInLine,
		Message: "The registry row matches the spec"}
	if differs != "" {
		msg := "The registry row differs from the spec: " + differs + ". The Student is observed, so the controller does not write it; " +
			"set spec.management to Manage to bring the row in line"
		ready = notReady(studentv1.ReasonDrifted, msg)
		drifted.Status, drifted.Reason, drifted.Message = metav1.ConditionTrue, studentv1.ReasonDrifted, msg
	}
	if _, err := c.updateStatus(ctx, s, ready, s.Status.Registry, drifted); err != nil {
		return err
	}
	c.cfg.Metrics.observeReported(key, s.Generation, c.clock.Now())
	switch {
	case differs != "" && !wasDrifted:
		c.write.warn(s, EventDrifted, drifted.Message)
	case differs == "" && wasDrifted:
		c.write.event(s, corev1.EventTypeNormal, EventInLine, "The registry row matches the spec again")
	}
	return nil
}

// finalizeObserved lets an observed Student go and leaves its row as it is: marked
// observed, so that the sweep leaves it too. A row of another owner, or none, is left
// alone.
func (c *Controller) finalizeObserved(ctx context.Context, s *studentv1.Student) error {
	row, err := c.rows.Get(ctx, RowUID(s))
	switch {
	case errors.Is(err, registry.ErrNotFound), errors.Is(err, registry.ErrMalformed):
		// None, or one the schema's checks would refuse to mark: the sweep skips
		// unreadable rows, and lets none go.
	case err != nil:
		return c.registryFailed(ctx, s, err)
	case row.Owner == c.cfg.Owner && row.Management != registry.ManagementObserve:
		if err := c.write.markObserved(ctx, row.UID, c.cfg.Owner); err != nil && !errors.Is(err, registry.ErrNotOwned) {
			return c.registryFailed(ctx, s, err)
		}
	}
	klog.FromContext(ctx).V(2).Info("Observed Student deleted: its registry row stays as it is")
	return nil
}
