package controller

import (
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// RowUID is the uid of s's registry row: the row-uid annotation of a Student that adopt
// bound to a row with a key of its own (another system's), else s's own uid.
func RowUID(s *studentv1.Student) string {
	if row := s.Annotations[studentv1.AnnotationRowUID]; row != "" {
		return row
	}
	return string(s.UID)
}

// HasRow says whether s, the Student at a row's namespace and name, may be that row's:
// it names the row, the row is bound to it, or the row's key is its uid. Absence
// destroys nothing, so the sweep and prune take a row for one without its Student only
// when none of these holds: a row-uid annotation added, removed or copied since never
// makes a Student's row look orphaned.
func HasRow(s *studentv1.Student, row registry.Record) bool {
	return RowUID(s) == row.UID || string(s.UID) == row.UID || row.StudentUID != "" && string(s.UID) == row.StudentUID
}
