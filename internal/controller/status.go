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

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

func ready() metav1.Condition {
	return metav1.Condition{
		Type: studentv1.ConditionReady, Status: metav1.ConditionTrue,
		Reason: studentv1.ReasonSynced, Message: "The registry row matches the spec",
	}
}

func notReady(reason, message string) metav1.Condition {
	return metav1.Condition{
		Type: studentv1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: reason, Message: message,
	}
}

// registryStatus is what the status shows of a stored row. Times are kept to the
// second, as the API server stores them, so that an unchanged row compares equal.
func registryStatus(row registry.Record) *studentv1.RegistryStatus {
	written := metav1.NewTime(row.UpdatedAt.Truncate(time.Second))
	return &studentv1.RegistryStatus{Owner: row.Owner, LastWrittenTime: &written, WrittenGeneration: row.Generation}
}

// updateStatus sets the Ready condition, observedGeneration and registry facts on s
// and writes the status, only if that changed anything. It reports whether it wrote.
// The status it writes is also no longer paused, and records a reconcile request as
// handled.
//
// drifted is the Drifted condition of an observed Student's report (nil otherwise: a
// managed Student's status then holds none, and an observed one's keeps what it had). A drifted Student is counted in students_drifted, not in
// students_not_ready: drift is what observing reports, not a fault.
func (c *Controller) updateStatus(ctx context.Context, s *studentv1.Student, cond metav1.Condition, reg *studentv1.RegistryStatus, drifted ...metav1.Condition) (bool, error) {
	key := cache.MetaObjectToName(s).String()
	c.cfg.Metrics.observeReady(key, cond.Status == metav1.ConditionTrue || cond.Reason == studentv1.ReasonDrifted)
	if len(drifted) > 0 || !observed(s.Spec) {
		// An observed Student's failure (the registry out of reach) keeps what it last
		// found, as its status does.
		c.cfg.Metrics.observeDrifted(key, len(drifted) > 0 && drifted[0].Status == metav1.ConditionTrue)
	}
	status := *s.Status.DeepCopy()
	status.ObservedGeneration = s.Generation
	status.Registry = reg
	if len(drifted) == 0 && !observed(s.Spec) {
		meta.RemoveStatusCondition(&status.Conditions, studentv1.ConditionDrifted)
	}
	for _, cond := range append([]metav1.Condition{cond}, drifted...) {
		cond.ObservedGeneration = s.Generation
		cond.LastTransitionTime = metav1.NewTime(c.clock.Now().Truncate(time.Second))
		// Keeps the transition time when the condition's status did not change.
		meta.SetStatusCondition(&status.Conditions, cond)
	}
	unpausedStatus(&status)
	if token := reconcileRequest(s); token != "" && utf8.RuneCountInString(token) <= maxReconcileToken {
		status.LastHandledReconcileAt = token
	}
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
