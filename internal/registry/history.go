package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// What the history records of a write: the action done to the row.
const (
	ActionCreated  = "created"
	ActionUpdated  = "updated"
	ActionRestored = "restored"
	ActionDeleted  = "deleted"
	ActionReleased = "released"
	ActionAdopted  = "adopted"
)

// Why a row was written, as the history records it.
const (
	// CauseNewStudent: the first row of a new Student.
	CauseNewStudent = "new-student"
	// CauseSpecChange: the Student's spec changed (a new generation).
	CauseSpecChange = "spec-change"
	// CauseDrift: the row had been changed, or made unreadable, by someone else.
	CauseDrift = "drift"
	// CauseRestore: the row had gone missing after it was written.
	CauseRestore = "restore"
	// CauseFinalizer: the Student was deleted; its finalizer let the row go.
	CauseFinalizer = "finalizer"
	// CauseSweep: a sweep found the row without its Student.
	CauseSweep = "sweep"
	// CauseStaleCache: the row was written from a cache that was behind, for a Student
	// already gone, and is let go again.
	CauseStaleCache = "stale-cache"
	// CauseCRDDeleted: the Student was deleted because the Student CRD is being
	// deleted (which deletes every Student), not by a user: its row is released.
	CauseCRDDeleted = "crd-deleted"
	// CauseRegistryBehind: the Student was deleted while the registry was behind the
	// cluster's mark, unconfirmed: its row is released, not deleted.
	CauseRegistryBehind = "registry-behind"
	// CauseOwnerMove: the owner was renamed (student-controller registry rename-owner).
	CauseOwnerMove = "owner-move"
	// CausePolicyRecorded: a row written before rows recorded their deletion policy
	// got its Student's (RecordPolicy); nothing else of it changed.
	CausePolicyRecorded = "policy-recorded"
	// CauseRegistryAhead: the row held a newer generation than the Student the API
	// server returns (the cluster went back in time: an etcd restore); it follows the
	// Student again (Rewind).
	CauseRegistryAhead = "registry-ahead"
	// CauseObserved: the row's Student only observes it now (spec.management:
	// Observe); the row is marked so (MarkObserved), and nothing else of it changed.
	CauseObserved = "observed"
	// CauseAdopted: student-controller registry adopt made a Student from the row, and
	// bound the row to it.
	CauseAdopted = "adopted"
	// CauseRebound: the row was bound again to the Student of its namespace and name
	// that names it (its row-uid annotation): by the sync, when it had no owner or
	// binding and the owner's history showed it as its own; by registry adopt, when it
	// was bound to a Student of that name that is gone, or to none.
	CauseRebound = "rebound"
	// CauseTakenBack: a live Student of the row's uid took back the row that its
	// owner had released (an etcd restore undid the Student's deletion).
	CauseTakenBack = "taken-back"
	// CausePrune: student-controller registry prune deleted a row that its owner
	// had released without its Student, while it recorded the Delete policy.
	CausePrune = "prune"
	// CauseBeforeManaged: the row as it stood while its Student observed it, kept by
	// the history just before the write that manages it again overwrote it (another
	// system's values, which nobody else keeps).
	CauseBeforeManaged = "before-managed"
	// CauseBeforeTakenBack: the released row as it stood (another system may have
	// written it since), kept by the history just before its owner took it back.
	CauseBeforeTakenBack = "before-taken-back"
)

// Why says why a row is written, for the history row written with it.
type Why struct {
	// Action is what Upsert does: ActionCreated, ActionUpdated (when empty) or
	// ActionRestored. Delete, Release and Relinquish record what they did.
	Action string
	// Cause is one of the Cause constants; "unspecified" when empty.
	Cause string
	// KeepObserved says the row may be observed and this write manages it again:
	// the history first keeps the row as it stands (CauseBeforeManaged), if it is
	// observed, in the same transaction.
	KeepObserved bool
}

// keepAsItStandsSQL copies a row into the history as it stands, before a write that
// overwrites values another system may have written: the owner's observed row, or a
// row the owner released. $1 is the time, $2 the owner, $3 the actor, $4 the uid and
// $5 the cause; nothing is copied of any other row.
const keepAsItStandsSQL = `INSERT INTO student_history
	(at, uid, namespace, name, student_name, school, generation, action, owner, cause, actor, deletion_policy)
	SELECT $1, uid, namespace, name, student_name, school, generation, '` + ActionUpdated + `', $2, $5, $3,
		CASE WHEN deletion_policy IN ('Delete', 'Orphan') THEN deletion_policy END
	FROM students WHERE uid = $4 AND ((owner = $2 AND management IS NOT NULL) OR (owner IS NULL AND released_by = $2))`

// HistoryEntry is one row of the history.
type HistoryEntry struct {
	ID          int64
	At          time.Time
	UID         string
	Namespace   string
	Name        string
	StudentName string
	School      string
	Generation  int64
	Action      string
	Owner       string
	Cause       string
	Actor       string
	// DeletionPolicy is the policy the write left the row with; empty where unknown.
	DeletionPolicy string
}

const historyInsertSQL = `INSERT INTO student_history
	(at, uid, namespace, name, student_name, school, generation, action, owner, cause, actor, deletion_policy)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`

// entry is a history row about to be written: the values of the students row are
// taken as the database returned them (any), so that one written past the schema is
// recorded as it was rather than failing the write.
type entry struct {
	uid, action, owner, cause                                string
	namespace, name, studentName, school, generation, policy any
}

// entryOf is the history row of a write of rec.
func entryOf(rec Record, action, cause string) entry {
	return entry{uid: rec.UID, action: action, owner: rec.Owner, cause: cause,
		namespace: rec.Namespace, name: rec.Name, studentName: rec.StudentName, school: rec.School, generation: rec.Generation,
		policy: policyValue(rec.DeletionPolicy)}
}

// values are the values historyInsertSQL writes for e, at at by actor, in its order.
func (e entry) values(at time.Time, actor string) []any {
	return []any{at, e.uid, e.namespace, e.name, e.studentName, e.school, e.generation, e.action, e.owner, e.cause, actor, e.policy}
}

// returned is what a delete or release returns of the row it changed: what its history
// row copies.
const returned = ` RETURNING namespace, name, student_name, school, generation, deletion_policy`

// scanReturned reads the RETURNING of a delete or release into e; false when no row
// was changed.
func scanReturned(row *sql.Row, e *entry) (bool, error) {
	err := row.Scan(&e.namespace, &e.name, &e.studentName, &e.school, &e.generation, &e.policy)
	if p, ok := e.policy.(string); ok {
		e.policy = policyValue(p) // a value past the schema is recorded as unknown
	}
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// turn waits for this process's turn at SQLite's write lock (Registry.writer) and
// returns what ends it, to be called once the transaction has ended; on PostgreSQL
// and read-only it waits for nothing. Writes of this process that run alongside the
// workers' (the history's prune, the fence) take it too: SQLite's busy handler would
// seldom find the lock free between two turns. On PostgreSQL they do not wait for the
// workers' groups: a group held up by a row's lock must not hold up the fence's
// renewal, which locks only the fence's row.
func (r *Registry) turn(ctx context.Context) (func(), error) {
	if r.writer == nil || r.dialect != sqlite {
		return func() {}, nil
	}
	select {
	case r.writer <- struct{}{}:
		return func() { <-r.writer }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for this process's turn to write: %w", ctx.Err())
	}
}

// History returns the history of the Student namespace/name, oldest first: every
// write of a row of that name, whatever its uid (a Student deleted and created again
// has two).
func (r *Registry) History(ctx context.Context, namespace, name string) ([]HistoryEntry, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT id, at, uid, COALESCE(namespace, ''), COALESCE(name, ''),
		COALESCE(student_name, ''), COALESCE(school, ''), COALESCE(generation, 0), action, owner, cause, actor,
		COALESCE(deletion_policy, '')
		FROM student_history WHERE namespace = $1 AND name = $2 ORDER BY id`, namespace, name)
	if err != nil {
		return nil, fmt.Errorf("read the history of %s/%s: %w", namespace, name, err)
	}
	defer rows.Close()
	var out []HistoryEntry
	for rows.Next() {
		var h HistoryEntry
		if err := rows.Scan(&h.ID, &h.At, &h.UID, &h.Namespace, &h.Name, &h.StudentName, &h.School, &h.Generation,
			&h.Action, &h.Owner, &h.Cause, &h.Actor, &h.DeletionPolicy); err != nil {
			return nil, fmt.Errorf("read the history of %s/%s: %w", namespace, name, err)
		}
		h.At = h.At.UTC()
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the history of %s/%s: %w", namespace, name, err)
	}
	return out, nil
}

// LastHistory returns the newest history row of the Student namespace/name of uid:
// false when the history has none (never written, or pruned past its retention).
func (r *Registry) LastHistory(ctx context.Context, namespace, name, uid string) (HistoryEntry, bool, error) {
	h := HistoryEntry{UID: uid}
	err := r.db.QueryRowContext(ctx, `SELECT id, at, COALESCE(namespace, ''), COALESCE(name, ''),
		COALESCE(student_name, ''), COALESCE(school, ''), COALESCE(generation, 0), action, owner, cause, actor,
		COALESCE(deletion_policy, '')
		FROM student_history WHERE namespace = $1 AND name = $2 AND uid = $3 ORDER BY id DESC LIMIT 1`, namespace, name, uid).Scan(
		&h.ID, &h.At, &h.Namespace, &h.Name, &h.StudentName, &h.School, &h.Generation, &h.Action, &h.Owner, &h.Cause, &h.Actor, &h.DeletionPolicy)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return HistoryEntry{}, false, nil
	case err != nil:
		return HistoryEntry{}, false, fmt.Errorf("read the last history row of %s/%s: %w", namespace, name, err)
	}
	h.At = h.At.UTC()
	return h, true, nil
}

// pruneBatch is how many history rows one prune transaction deletes: small enough
// that no writer waits long for the lock it holds.
const pruneBatch = 1000

// PruneHistory deletes the history rows written before before, pruneBatch at a time,
// each batch its own short transaction, and returns how many went. It stops early,
// with what it deleted so far, when ctx is done.
func (r *Registry) PruneHistory(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	for {
		done, err := r.turn(ctx)
		if err != nil {
			return total, fmt.Errorf("prune the history before %s: %w", before.UTC().Format(time.RFC3339), err)
		}
		var n int64
		err = r.fencedTx(ctx, func(tx *sql.Tx) error {
			var err error
			n, err = affected(tx.ExecContext(ctx, `DELETE FROM student_history WHERE id IN
				(SELECT id FROM student_history WHERE at < $1 ORDER BY at LIMIT $2)`, before.UTC(), pruneBatch))
			return err
		})
		done()
		total += n
		if err != nil {
			return total, fmt.Errorf("prune the history before %s: %w", before.UTC().Format(time.RFC3339), err)
		}
		if n < pruneBatch {
			return total, nil
		}
	}
}
