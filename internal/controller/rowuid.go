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

// rowNotBound says why s may not have the row its row-uid annotation names: the row
// records another Student's uid, or none (the annotation was copied or set by hand).
// "" when s names no row of its own, the row is bound to s, or there is no such row
// (the write that makes it binds it to s).
func (c *Controller) rowNotBound(ctx context.Context, s *studentv1.Student) (string, error) {
	key := RowUID(s)
	if key == string(s.UID) {
		return "", nil
	}
	row, err := c.rows.Get(ctx, key)
	switch {
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
