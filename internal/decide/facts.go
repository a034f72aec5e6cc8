package decide

import (
	"fmt"
	"time"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// Facts are what is known about one Student when its row's fate is decided. A fact
// not known yet is asked for (Decision.Ask); the caller finds it out and decides again.
type Facts struct {
	// Owner marks the rows this controller writes.
	Owner   string
	Student Student
	Row     Row
	// Quorum is the API server's answer to a quorum read of the Student, asked before
	// anything that undoes production's past.
	Quorum Quorum
	// History is what the registry's history says of a missing row; Deleted its entry
	// when the last one deleted it.
	History History
	Deleted registry.HistoryEntry
	// CRD is whether the CRD is being deleted, asked by a finalizer that would delete
	// a row. CRDOlder: the served CRD lacks fields this controller writes (the watch
	// says so, or the Student came through such a CRD).
	CRD      CRD
	CRDOlder bool
	// RegistryBehind: the registry is behind the cluster's mark of it (it went back
	// in time) and no operator has confirmed it, or the marks are not compared yet.
	RegistryBehind bool
	// UndoLeft says the bound of rows undone (--registry-max-rewinds, MaxUndo) has
	// room for one more.
	UndoLeft bool
	MaxUndo  int
}

// Student is what the decision reads of a Student.
type Student struct {
	Namespace, Name, UID string
	Generation           int64
	Spec                 studentv1.StudentSpec
	// RowKey is the uid of its row: its row-uid annotation, or its own uid.
	RowKey string
	// Deleting: its deletion timestamp is set. Finalizer: it carries the controller's.
	Deleting, Finalizer bool
	Paused              bool
	// Written: its status says a row was written before. Drifted: its status says the
	// observed row differs from the spec.
	Written, Drifted bool
}

// NamesRow says whether the Student names a row whose key is not its own uid (adopt
// bound it to a row another system keys).
func (s Student) NamesRow() bool { return s.RowKey != s.UID }

// Observed says whether the Student only observes its row.
func (s Student) Observed() bool { return s.Spec.Management == studentv1.ManagementObserve }

// Policy is the Student's deletion policy, Delete when unset.
func (s Student) Policy() studentv1.DeletionPolicy { return SpecPolicy(s.Spec) }

// Read is what reading the Student's row found.
type Read int

const (
	// Unread: not read yet.
	Unread Read = iota
	Absent
	// Malformed: a row the registry cannot decode.
	Malformed
	Found
)

// Row is what is known of the Student's row.
type Row struct {
	Read   Read
	Record registry.Record
	// Exists: an insert found a row there. Stale: a write was refused because the row
	// holds a newer generation. Both ask for a read next.
	Exists, Stale bool
	// Refused is why the registry refused a write as not this owner's to make (another
	// owner's row, or an observed one); "" when it did not.
	Refused string
}

// Quorum is what a quorum read of the Student says.
type Quorum int

const (
	QuorumUnasked Quorum = iota
	// QuorumCurrent: the API server holds the version of the Student the cache does.
	QuorumCurrent
	// QuorumGone: it has no such Student (or another of that name): the cache is behind.
	QuorumGone
	// QuorumChanged: it holds a newer version: the watch brings it.
	QuorumChanged
)

// History is what the registry's history says of a missing row.
type History int

const (
	HistoryUnasked History = iota
	// HistoryDeleted: its last history row is a delete (a finalizer of this Student ran).
	HistoryDeleted
	// HistoryOwned: its last history row is this owner's write, and not a delete: the
	// row was this owner's.
	HistoryOwned
	HistoryOther
)

// HistoryOf is what the last history row of a Student's row says (ok: there is one),
// for owner.
func HistoryOf(owner string, last registry.HistoryEntry, ok bool) History {
	switch {
	case ok && last.Action == registry.ActionDeleted:
		return HistoryDeleted
	case ok && last.Owner == owner:
		return HistoryOwned
	}
	return HistoryOther
}

// CRD is the state of the Student CRD that the API server serves.
type CRD int

const (
	CRDUnasked CRD = iota
	CRDCurrent
	// CRDDeleting: it is being deleted, and its Students with it: not by their users.
	CRDDeleting
)

// Want is the row a Student should have, written by owner.
func Want(owner string, s Student) registry.Record {
	studentUID := ""
	if s.NamesRow() {
		studentUID = s.UID
	}
	management := ""
	if s.Observed() {
		management = registry.ManagementObserve
	}
	return registry.Record{
		UID: s.RowKey, StudentUID: studentUID, Namespace: s.Namespace, Name: s.Name,
		StudentName: s.Spec.Name, School: s.Spec.School, Owner: owner, Generation: s.Generation,
		DeletionPolicy: string(SpecPolicy(s.Spec)), Management: management,
	}
}

// SpecPolicy is spec's deletion policy, Delete when unset.
func SpecPolicy(spec studentv1.StudentSpec) studentv1.DeletionPolicy {
	if spec.DeletionPolicy == "" {
		return studentv1.DeletionPolicyDelete
	}
	return spec.DeletionPolicy
}

// SameRow says whether a stored row already holds what want would write.
func SameRow(row, want registry.Record) bool {
	return row.UID == want.UID && row.Namespace == want.Namespace && row.Name == want.Name &&
		row.StudentName == want.StudentName && row.School == want.School &&
		row.Owner == want.Owner && row.Generation == want.Generation && row.DeletionPolicy == want.DeletionPolicy &&
		row.Management == want.Management
}

// TakenBack says whether a live Student of row's key takes row back: owner released
// it, and nobody has taken or observed it since.
func TakenBack(row registry.Record, owner string) bool {
	return row.Owner == "" && row.ReleasedBy == owner && row.Management == ""
}

// OwnedBy says whose row is, for messages.
func OwnedBy(r registry.Record) string {
	if r.Owner == "" {
		return "released"
	}
	return fmt.Sprintf("owned by %q", r.Owner)
}

// stamp is how the messages write a time.
func stamp(t time.Time) string { return t.Format(time.RFC3339) }
