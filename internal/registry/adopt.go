package registry

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
)

// adoptSQL binds a row to its Student and owner ($2, $5): released rows, rows another
// system inserted (no owner) and the owner's own. The row keeps its uid, the key that
// system writes it by, and records its Student's in student_uid (NULL when they are
// the same) and the Student's management ($8). A row bound again ($9) must still
// record the Student's namespace and name. The student's record (names, school,
// created_at, updated_at) stays as it was.
const adoptSQL = `
	UPDATE students SET student_uid = CASE WHEN uid = $2 THEN NULL ELSE $2 END, namespace = $3, name = $4, owner = $5,
		generation = $6, deletion_policy = $7, released_at = NULL, released_by = NULL, release_cause = NULL, management = $8
	WHERE uid = $1 AND (owner IS NULL OR owner = $5) AND (NOT $9 OR namespace = $3 AND name = $4)` + returned

// ListAll returns every readable row of the registry, whatever its owner, by
// namespace, name and UID, and apart from them the rows it cannot read.
func (r *Registry) ListAll(ctx context.Context) ([]Record, []MalformedRow, error) {
	out, malformed, err := r.query(ctx, `SELECT `+columns+` FROM students`)
	if err != nil {
		return nil, nil, fmt.Errorf("list rows: %w", err)
	}
	slices.SortFunc(out, func(a, b Record) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name), strings.Compare(a.UID, b.UID))
	})
	return out, malformed, nil
}

// Adopt binds the row of uid from to the Student rec names (rec.UID, its namespace
// and name), owned by rec.Owner, at rec.Generation, rec.DeletionPolicy and
// rec.Management, in one transaction with a history row (ActionAdopted, and cause:
// CauseAdopted for a Student adopt made, CauseRebound for one that lost it). The
// row keeps its uid (from): the Student's goes into student_uid, and the Student
// names the row by its row-uid annotation. Only a released row, one with no owner
// (another system's) or rec.Owner's own is bound; another owner's is ErrNotOwned, a
// missing one ErrNotFound. The student's record in it is not changed.
func (r *Registry) Adopt(ctx context.Context, from string, rec Record, cause string) error {
	if err := requireKey("adopt", rec); err != nil {
		return err
	}
	var n int64
	err := r.write(ctx, r.now().UTC(), func(ctx context.Context, in func(*sql.Stmt) *sql.Stmt) ([]entry, error) {
		e := entry{uid: from, action: ActionAdopted, owner: rec.Owner, cause: cause}
		bound, err := scanReturned(in(r.adopt).QueryRowContext(ctx, from, rec.UID, rec.Namespace, rec.Name, rec.Owner,
			rec.Generation, policyValue(rec.DeletionPolicy), managementValue(rec.Management), cause == CauseRebound), &e)
		if !bound {
			return nil, err
		}
		n = 1
		return []entry{e}, nil
	})
	if err != nil {
		return fmt.Errorf("adopt row %s: %w", from, err)
	}
	if n > 0 {
		return nil
	}
	return fmt.Errorf("adopt row %s: %w", from, r.notWritten(ctx, Record{UID: from, Owner: rec.Owner}))
}
