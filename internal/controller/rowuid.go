package controller

import (
	"context"
	"errors"
	"fmt"

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

// rowNotBound says why s may not have the row its row-uid annotation names: the row
// records another Student's uid, or none (the annotation was copied or set by hand);
// or, for a write (write), the row is missing: writing it would take another system's
// key on the word of an annotation alone. "" when s names no row of its own, the row
// is bound to s, or (not for a write) there is no such row.
func (c *Controller) rowNotBound(ctx context.Context, s *studentv1.Student, write bool) (string, error) {
	key := RowUID(s)
	if key == string(s.UID) {
		return "", nil
	}
	row, err := c.rows.Get(ctx, key)
	switch {
	case errors.Is(err, registry.ErrNotFound) && write:
		return fmt.Sprintf("the row %s that annotation %s names is missing (deleted by the system that wrote it, or by hand): put it back, "+
			"or remove the annotation to give the Student a row of its own uid", key, studentv1.AnnotationRowUID), nil
	case errors.Is(err, registry.ErrNotFound):
		return "", nil
	case errors.Is(err, registry.ErrMalformed):
		return fmt.Sprintf("the row %s that annotation %s names cannot be read, so whose it is cannot be told", key, studentv1.AnnotationRowUID), nil
	case err != nil:
		return "", err
	case row.StudentUID == string(s.UID):
		return "", nil
	case row.StudentUID == "":
		return fmt.Sprintf("the row %s that annotation %s names is bound to no adopted Student (its key is its own Student's, or another system's "+
			"that adopt did not bind): the annotation was set by hand; remove it",
			key, studentv1.AnnotationRowUID), nil
	}
	return fmt.Sprintf("the row %s that annotation %s names is bound to Student %s, not to this one: the annotation was copied; remove it",
		key, studentv1.AnnotationRowUID, row.StudentUID), nil
}

// refuseUnbound reports a Student that names a row bound to another: Ready=False,
// RowNotBound, a Warning Event when that is new, and nothing written. A change to the
// Student brings it back.
func (c *Controller) refuseUnbound(ctx context.Context, s *studentv1.Student, problem string) error {
	changed, err := c.updateStatus(ctx, s, notReady(studentv1.ReasonRowNotBound, "Nothing written: "+problem), s.Status.Registry)
	if err != nil {
		return err
	}
	if changed {
		c.write.warn(s, EventRowNotBound, problem)
	}
	return terminal(fmt.Errorf("row not bound: %s", problem))
}
