package controller

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// The annotations by which an operator steers one Student (studentv1 documents them).

// paused says whether the paused annotation holds the Student still: only the value
// "true" does, so that a typo never pauses a Student nobody meant to.
func paused(s *studentv1.Student) bool {
	return s.Annotations[studentv1.AnnotationPaused] == "true"
}

// reconcileRequest is the token of an unhandled reconcile request, "" when there is
// none: the annotation's value, when status does not record it as handled yet.
func reconcileRequest(s *studentv1.Student) string {
	token := s.Annotations[studentv1.AnnotationReconcileRequestedAt]
	if token == s.Status.LastHandledReconcileAt {
		return ""
	}
	return token
}

// maxReconcileToken is the longest reconcile request token, in characters, that status
// records (the CRD's bound on status.lastHandledReconcileAt): a longer one is handled,
// not recorded.
const maxReconcileToken = 256

// steered says whether an update changed how the operator steers the Student: pause,
// unpause, a new reconcile request, or the row it names. The API server does not bump
// the generation for annotations, so needsSync asks this.
func steered(oldS, newS *cachedStudent) bool {
	return oldS.isPaused() != newS.isPaused() || oldS.rareField().reconcileRequestedAt != newS.rareField().reconcileRequestedAt ||
		oldS.rowUID() != newS.rowUID()
}

// holdPaused is the whole sync of a paused Student: no registry read or write, no
// finalizer added or removed, and status changed only to say that it is paused (a
// Synced=False condition, reason Paused); Ready keeps what the controller last saw.
// A paused Student being deleted stays Terminating until it is unpaused.
func (c *Controller) holdPaused(ctx context.Context, s *studentv1.Student) error {
	key := cache.MetaObjectToName(s).String()
	msg := fmt.Sprintf("Paused by the annotation %s: the controller does not write the registry row until it is removed", studentv1.AnnotationPaused)
	if s.DeletionTimestamp != nil {
		msg = fmt.Sprintf("Paused by the annotation %s: the deletion waits, and the row stays as it is, until it is removed", studentv1.AnnotationPaused)
	}
	cond := metav1.Condition{
		Type: studentv1.ConditionSynced, Status: metav1.ConditionFalse, Reason: studentv1.ReasonPaused, Message: msg,
		ObservedGeneration: s.Generation, LastTransitionTime: metav1.NewTime(c.clock.Now().Truncate(time.Second)),
	}
	status := *s.Status.DeepCopy()
	meta.SetStatusCondition(&status.Conditions, cond)
	since := meta.FindStatusCondition(status.Conditions, studentv1.ConditionSynced).LastTransitionTime.Time
	if !equality.Semantic.DeepEqual(s.Status, status) {
		s.Status = status
		if _, err := c.write.updateStatus(ctx, s); err != nil {
			return fmt.Errorf("update status: %w", err)
		}
		klog.FromContext(ctx).Info("Student paused: nothing is written for it until the annotation goes", "annotation", studentv1.AnnotationPaused)
	}
	c.cfg.Metrics.observePaused(key, since)
	return nil
}

// unpausedStatus drops the Synced condition that holdPaused left, from a status about
// to be written.
func unpausedStatus(status *studentv1.StudentStatus) {
	meta.RemoveStatusCondition(&status.Conditions, studentv1.ConditionSynced)
}
