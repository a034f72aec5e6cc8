package controller

import (
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// RowUID is the uid of s's registry row: the row-uid annotation adopt sets for a row keyed
// elsewhere, else s's uid.
func RowUID(s *studentv1.Student) string {
	if row := s.Annotations[studentv1.AnnotationRowUID]; row != "" {
		return row
	}
	return string(s.UID)
}

// HasRow says whether s, the Student at a row's namespace and name, may own the row: s
// names it, the row is bound to s, or its key is s's uid. Absence destroys nothing, so the
// sweep and prune take a row for an orphan only when none holds: a row-uid annotation
// added, removed or copied never makes a Student's row look orphaned.
func HasRow(s *studentv1.Student, row registry.Record) bool {
	return RowUID(s) == row.UID || string(s.UID) == row.UID || row.StudentUID != "" && string(s.UID) == row.StudentUID
}

// The annotations by which an operator steers one Student (studentv1 documents them).

// paused says whether the annotation pauses the Student: only "true", so typos never do.
func paused(s *studentv1.Student) bool {
	return s.Annotations[studentv1.AnnotationPaused] == "true"
}

// reconcileRequest is the annotation's token until status records it handled, else "".
func reconcileRequest(s *studentv1.Student) string {
	token := s.Annotations[studentv1.AnnotationReconcileRequestedAt]
	if token == s.Status.LastHandledReconcileAt {
		return ""
	}
	return token
}

// maxReconcileToken is the longest token status records (the CRD's bound on
// status.lastHandledReconcileAt); a longer one is handled, not recorded.
const maxReconcileToken = 256

// steered says whether an update changed how the operator steers the Student: pause, a
// new reconcile request, or the row it names. Annotations do not bump the generation.
func steered(oldS, newS *cachedStudent) bool {
	return oldS.isPaused() != newS.isPaused() || oldS.rareField().reconcileRequestedAt != newS.rareField().reconcileRequestedAt ||
		oldS.rowUID() != newS.rowUID()
}
