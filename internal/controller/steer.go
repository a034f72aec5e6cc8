package controller

import (
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
