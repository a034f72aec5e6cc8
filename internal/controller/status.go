package controller

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/student-controller/student-controller/internal/decide"
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// registryStatus is what the status shows of a row; times are to the second, as the API
// server keeps them, so an unchanged row compares equal.
func registryStatus(row registry.Record) *studentv1.RegistryStatus {
	written := metav1.NewTime(row.UpdatedAt.Truncate(time.Second))
	return &studentv1.RegistryStatus{Owner: row.Owner, LastWrittenTime: &written, WrittenGeneration: row.Generation}
}

// updateStatus writes st on s if it changes anything, and reports whether it wrote; it is
// the only writer of a Student's status. row (written or found) fills status.registry. It
// clears the paused form (Synced=False alone) and marks a reconcile request handled.
func (c *Controller) updateStatus(ctx context.Context, s *studentv1.Student, st decide.Status, row registry.Record) (bool, error) {
	now := metav1.NewTime(c.clock.Now().Truncate(time.Second))
	status := *s.Status.DeepCopy()
	if st.Paused {
		return c.writePaused(ctx, s, status, now)
	}
	var drifted *bool
	if st.Drifted != nil || s.Spec.Management != studentv1.ManagementObserve {
		// An observed Student's failure (the registry out of reach) keeps the drift it
		// last found, as its status does.
		drifted = new(st.Drifted != nil && *st.Drifted)
	}
	c.states.synced(cache.MetaObjectToName(s).String(), st.Ready || st.Reason == studentv1.ReasonDrifted, drifted)
	status.ObservedGeneration = s.Generation
	if st.Registry == decide.FromRow {
		status.Registry = registryStatus(row)
	}
	conds := []metav1.Condition{{Type: studentv1.ConditionReady, Status: metav1.ConditionFalse, Reason: st.Reason, Message: st.Message}}
	if st.Ready {
		conds[0].Status = metav1.ConditionTrue
	}
	if st.Drifted != nil {
		drifted := metav1.Condition{Type: studentv1.ConditionDrifted, Status: metav1.ConditionFalse, Reason: studentv1.ReasonInLine,
			Message: "The registry row matches the spec"}
		if *st.Drifted {
			drifted.Status, drifted.Reason, drifted.Message = metav1.ConditionTrue, studentv1.ReasonDrifted, st.Message
		}
		conds = append(conds, drifted)
	} else if s.Spec.Management != studentv1.ManagementObserve {
		meta.RemoveStatusCondition(&status.Conditions, studentv1.ConditionDrifted)
	}
	for _, cond := range conds {
		cond.ObservedGeneration = s.Generation
		cond.LastTransitionTime = now
		// Keeps the transition time when the condition's status did not change.
		meta.SetStatusCondition(&status.Conditions, cond)
	}
	meta.RemoveStatusCondition(&status.Conditions, studentv1.ConditionSynced)
	if token := reconcileRequest(s); token != "" && utf8.RuneCountInString(token) <= maxReconcileToken {
		status.LastHandledReconcileAt = token
	}
	return c.writeStatus(ctx, s, status)
}

// writePaused is updateStatus's paused form: Synced=False, reason Paused.
func (c *Controller) writePaused(ctx context.Context, s *studentv1.Student, status studentv1.StudentStatus, now metav1.Time) (bool, error) {
	msg := fmt.Sprintf("Paused by the annotation %s: the controller does not write the registry row until it is removed", studentv1.AnnotationPaused)
	if s.DeletionTimestamp != nil {
		msg = fmt.Sprintf("Paused by the annotation %s: the deletion waits, and the row stays as it is, until it is removed", studentv1.AnnotationPaused)
	}
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: studentv1.ConditionSynced, Status: metav1.ConditionFalse,
		Reason: studentv1.ReasonPaused, Message: msg, ObservedGeneration: s.Generation, LastTransitionTime: now})
	since := meta.FindStatusCondition(status.Conditions, studentv1.ConditionSynced).LastTransitionTime.Time
	c.states.paused(cache.MetaObjectToName(s).String(), since)
	changed, err := c.writeStatus(ctx, s, status)
	if changed {
		klog.FromContext(ctx).Info("Student paused: nothing is written for it until the annotation goes", "annotation", studentv1.AnnotationPaused)
	}
	return changed, err
}

func (c *Controller) writeStatus(ctx context.Context, s *studentv1.Student, status studentv1.StudentStatus) (bool, error) {
	if equality.Semantic.DeepEqual(s.Status, status) {
		return false, nil
	}
	s.Status = status
	updated, err := c.write.updateStatus(ctx, s)
	if err != nil {
		return false, fmt.Errorf("update status: %w", err)
	}
	*s = *updated
	return true, nil
}

func isDrifted(s *studentv1.Student) bool {
	return meta.IsStatusConditionTrue(s.Status.Conditions, studentv1.ConditionDrifted)
}
