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
