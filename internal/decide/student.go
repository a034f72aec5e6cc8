package decide

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// Event reasons: Normal for changes to a written row; Warning for what needs a person.
const (
	EventRowUpdated        = "RowUpdated"
	EventRowRestored       = "RowRestored"
	EventRegistryError     = "RegistryError"
	EventRowOwnedElsewhere = "RowOwnedElsewhere"
	EventRowNotBound       = "RowNotBound"
	EventRowRebound        = "RowRebound"
	EventInvalidSpec       = "InvalidSpec"
	EventRegistryAhead     = "RegistryAhead"
	EventRowTakenBack      = "RowTakenBack"
	EventRowRecreated      = "RowRecreated"
	EventDrifted           = "Drifted"
	EventInLine            = "InLine"
)

// Decide says what to do for one Student; TestModel checks it over all the facts.
func Decide(f Facts) Decision {
	s := f.Student
	switch {
	case s.Paused && (!s.Deleting || s.Finalizer):
		return Decision{Status: &Status{Paused: true}}
	case s.Deleting && !s.Finalizer:
		return Decision{} // not this controller's to let go
	case s.Deleting:
		return finalize(f)
	case f.CRDOlder:
		// Writing would drop fields the older CRD lacks; its update requeues all Students.
		return Decision{Result: Terminal, Why: "the served Student CRD is older than this controller"}
	}
	return reconcile(f)
}

// reconcile decides for a live Student.
func reconcile(f Facts) Decision {
	s, row := f.Student, f.Row
	if problem := s.Spec.Validate(); problem != "" {
		return refuse(studentv1.ReasonInvalidSpec, problem, EventInvalidSpec, problem, "invalid spec: "+problem)
	}
	if s.NamesRow() {
		if row.Read == Unread {
			return ask(AskRow)
		}
		if BindingLost(row.Record, row.Read == Found, s) {
			// Only this owner's history rebinds it: a hand-set annotation, or a backup
			// older than the adoption, is refused and left to registry adopt.
			switch f.History {
			case HistoryUnasked:
				return ask(AskHistory)
			case HistoryOwned:
				return rebind(f)
			}
		}
		if problem := notBound(f, !s.Observed()); problem != "" {
			return refuse(studentv1.ReasonRowNotBound, "Nothing written: "+problem, EventRowNotBound, problem, "row not bound: "+problem)
		}
	}
	if s.Observed() {
		return observe(f)
	}
	return manage(f)
}

// manage decides for a live, valid, managed Student: its finalizer, then its row.
func manage(f Facts) Decision {
	s, row := f.Student, f.Row
	var d Decision
	if !s.Finalizer {
		d = d.with(Action{Op: AddFinalizer})
	}
	want := Want(f.Owner, s)
	switch {
	case row.Read == Unread && !s.Written && !row.Exists && !row.Stale && row.Refused == "":
		// A new Student, whose row is almost always absent: written without a read.
		return ready(d.with(Action{Op: Insert, Record: want, Why: registry.Why{Action: registry.ActionCreated, Cause: registry.CauseNewStudent}}))
	case row.Read == Unread:
		return ask(AskRow)
	case row.Refused != "":
		return after(d, ownedElsewhere(row.Refused))
	}
	found := row.Read == Found
	rec := row.Record
	if found {
		switch {
		case TakenBack(rec, f.Owner):
			return undo(f, d, Action{Op: TakeBack, Record: want, Why: registry.Why{Action: registry.ActionRestored, Cause: registry.CauseTakenBack}, Undo: true})
		case rec.Owner != f.Owner:
			return after(d, ownedElsewhere("the row is "+OwnedBy(rec)))
		case rec.DeletionPolicy == "":
			// Written before rows recorded their policy: no change to the record.
			d = d.with(Action{Op: RecordPolicy, Record: want, Why: registry.Why{Cause: registry.CausePolicyRecorded}})
			rec.DeletionPolicy = want.DeletionPolicy
		}
		if rec.Generation > want.Generation {
			return undo(f, d, Action{Op: Rewind, Record: want, Ahead: rec.Generation, Undo: true})
		}
	}
	if row.Stale {
		// Refused as older, yet the row read since is not ahead: it changed again.
		return after(d, Decision{Result: Retry, Why: "the row changed since its write was refused"})
	}
	why, write := RowWrite(rec, want, found || row.Read == Malformed, row.Read == Malformed, s.Written)
	if !write {
		return ready(d)
	}
	why.KeepObserved = found && rec.Management == registry.ManagementObserve || row.Read == Malformed
	upsert := Action{Op: Upsert, Record: want, Why: why}
	if why.Action == registry.ActionRestored {
		return restore(f, d, upsert)
	}
	return ready(d.with(upsert))
}

// RowWrite says whether to upsert want over row, and why. found: the registry holds a
// row; malformed: it is unreadable; written: the status reports an earlier write.
func RowWrite(row, want registry.Record, found, malformed, written bool) (registry.Why, bool) {
	switch {
	case found && !malformed && SameRow(row, want):
		return registry.Why{}, false
	case found && !malformed && row.Generation != want.Generation:
		return registry.Why{Action: registry.ActionUpdated, Cause: registry.CauseSpecChange}, true
	case found:
		return registry.Why{Action: registry.ActionUpdated, Cause: registry.CauseDrift}, true
	case written:
		return registry.Why{Action: registry.ActionRestored, Cause: registry.CauseRestore}, true
	}
	return registry.Why{Action: registry.ActionCreated, Cause: registry.CauseNewStudent}, true
}

// restore decides for a row missing after it was written: drift, or a cache behind (a new
// leader may hold a Student its predecessor finalized), so the API server is asked first.
// Writing back a row its finalizer deleted undoes production's past; the bound counts it.
func restore(f Facts, d Decision, upsert Action) Decision {
	if q, ok := confirmed(f); !ok {
		return after(d, q)
	}
	switch f.History {
	case HistoryUnasked:
		return ask(AskHistory)
	case HistoryOther, HistoryOwned:
		return ready(d.with(upsert))
	}
	if !f.UndoLeft {
		e := f.Deleted
		return after(d, pastBound(studentv1.ReasonRowDeleted, fmt.Sprintf("The registry row of this Student was deleted at %s (%s, by %s)",
			stamp(e.At), e.Cause, e.Actor), f.MaxUndo, fmt.Sprintf("row %s was deleted (%s)", f.Student.RowKey, e.Cause)))
	}
	upsert.Undo = true
	d = ready(d.with(upsert))
	e := f.Deleted
	d.Events = []Event{{Warning: true, Reason: EventRowRecreated, Message: fmt.Sprintf("The registry row of this Student was deleted at %s "+
		"(%s, by %s) while the Student is live here, and is written again (docs/runbooks.md#studentregistryrowsundone)", stamp(e.At), e.Cause, e.Actor)}}
	return d
}

// undo decides for a write that undoes production's past (rewind, take back): the API
// server must confirm the Student first, and the bound must have room.
func undo(f Facts, d Decision, a Action) Decision {
	if q, ok := confirmed(f); !ok {
		return after(d, q)
	}
	rec, want := f.Row.Record, a.Record
	if a.Op == Rewind {
		if !f.UndoLeft {
			return after(d, pastBound(studentv1.ReasonRegistryAhead, fmt.Sprintf("The registry row holds generation %d, newer than this Student's %d",
				rec.Generation, want.Generation), f.MaxUndo, fmt.Sprintf("row %s is ahead of its Student", rec.UID)))
		}
		d = d.with(a)
		d.Events = []Event{{Warning: true, Reason: EventRegistryAhead, Message: fmt.Sprintf("The registry row held generation %d, newer "+
			"than this Student's %d, and follows the Student again: %s, %s (docs/runbooks.md#studentregistryrowsahead)",
			rec.Generation, want.Generation, want.StudentName, want.School)}}
		if f.Student.Deleting {
			// It follows the Student first, then is released as it goes.
			d = d.with(Action{Op: Release, Record: want, Why: registry.Why{Cause: registry.CauseFinalizer}}, Action{Op: RemoveFinalizer})
			return d
		}
		return ready(d)
	}
	cause := cmp.Or(rec.ReleaseCause, "unknown cause")
	if !f.UndoLeft {
		return after(d, pastBound(studentv1.ReasonRowReleased, fmt.Sprintf("The registry row of this Student was released by this controller (%s) at %s",
			cause, stamp(rec.ReleasedAt)), f.MaxUndo, fmt.Sprintf("row %s was released", rec.UID)))
	}
	d = ready(d.with(a))
	d.Events = []Event{{Warning: true, Reason: EventRowTakenBack, Message: fmt.Sprintf("The registry row was released by this controller (%s) "+
		"at %s while this Student still exists, and is its row again: %s, %s (docs/runbooks.md#studentregistryrowsundone)",
		cause, stamp(rec.ReleasedAt), want.StudentName, want.School)}}
	return d
}

// confirmed says whether the API server confirms the cached Student, else what to do.
func confirmed(f Facts) (Decision, bool) {
	switch f.Quorum {
	case QuorumUnasked:
		return ask(AskQuorum), false
	case QuorumGone:
		return Decision{Why: "the Student is gone from the API server"}, false
	case QuorumChanged:
		return Decision{Result: Retry, Why: "the cache is behind the API server for this Student"}, false
	}
	return Decision{}, true
}

// ready completes d with the Ready status and the Event of the row write it makes.
func ready(d Decision) Decision {
	d.Status = &Status{Ready: true, Reason: studentv1.ReasonSynced, Message: "The registry row matches the spec", Registry: FromRow}
	if len(d.Events) > 0 {
		return d
	}
	for _, a := range d.Actions {
		if a.Op != Upsert {
			continue
		}
		switch a.Why.Action {
		case registry.ActionUpdated:
			d.Events = append(d.Events, Event{Reason: EventRowUpdated, Message: fmt.Sprintf("Registry row written: %s, %s", a.Record.StudentName, a.Record.School)})
		case registry.ActionRestored:
			d.Events = append(d.Events, Event{Reason: EventRowRestored, Message: fmt.Sprintf("Registry row was missing and is written again: %s, %s", a.Record.StudentName, a.Record.School)})
		}
	}
	return d
}

// after is then with the actions of d before its own.
func after(d, then Decision) Decision {
	then.Actions = append(slices.Clip(d.Actions), then.Actions...)
	return then
}

// refuse writes nothing, and says why in the status and a Warning, once.
func refuse(reason, msg, event, eventMsg, why string) Decision {
	return Decision{Status: &Status{Reason: reason, Message: msg}, Result: Terminal, Why: why,
		Events: []Event{{Warning: true, Reason: event, Message: eventMsg, OnChange: true}}}
}

// pastBound refuses a write that would undo production's past once the bound is spent:
// so many undos look like a clone or a cluster gone back in time, and only a restart
// with a higher bound helps.
func pastBound(reason, what string, maxUndo int, why string) Decision {
	msg := fmt.Sprintf("%s, and this controller has undone %d rows since it started, its bound (--registry-max-rewinds): "+
		"nothing was written (docs/troubleshooting.md#%s)", what, maxUndo, strings.ToLower(reason))
	return refuse(reason, msg, reason, msg, why+" and is past the bound of rows undone")
}

// ownedElsewhere refuses another owner's row: the controller never takes one over.
func ownedElsewhere(cause string) Decision {
	msg := "The registry row belongs to another owner and is left alone: " + cause + ". If that owner's rows are to " +
		"follow this controller, stop its controllers and run student-controller registry rename-owner; a row it released " +
		"can be bound to a new Student with student-controller registry adopt"
	// status.registry keeps what this controller wrote, so that writing the row back,
	// were it deleted next, counts as an undo.
	return refuse(studentv1.ReasonRowOwnedElsewhere, msg, EventRowOwnedElsewhere, msg, cause)
}

// BindingLost says whether the row a Student names (found) may have lost its binding
// while still the Student's: no owner (released, or rewritten whole by the system that
// keys it), no binding to this Student, and its namespace and name.
func BindingLost(rec registry.Record, found bool, s Student) bool {
	return found && rec.Owner == "" && rec.StudentUID != s.UID && rec.Namespace == s.Namespace && rec.Name == s.Name
}

// rebind decides to bind a lost row to its Student again, as adopt does (student fields
// as they stand), then decides for it as the Student's own.
func rebind(f Facts) Decision {
	s, rec := f.Student, f.Row.Record
	want := Want(f.Owner, s)
	var d Decision
	if !s.Finalizer && !s.Observed() {
		d, f.Student.Finalizer = d.with(Action{Op: AddFinalizer}), true
	}
	rec.Owner, rec.StudentUID, rec.Generation, rec.Management = f.Owner, s.UID, s.Generation, want.Management
	rec.DeletionPolicy, rec.ReleasedAt, rec.ReleasedBy, rec.ReleaseCause = want.DeletionPolicy, time.Time{}, "", ""
	d = d.with(Action{Op: Rebind, Record: rec, Why: registry.Why{Action: registry.ActionAdopted, Cause: registry.CauseRebound}})
	f.Row.Record = rec
	then := manage(f)
	if s.Observed() {
		then = observe(f)
	}
	then = after(d, then)
	then.Events = append([]Event{{Reason: EventRowRebound, Message: fmt.Sprintf("The registry row %s had no owner and no binding to this "+
		"Student, and this owner's history shows it as its own (the system that keys it wrote it again whole, or it was released and "+
		"this Student made again): it is bound to this Student again", rec.UID)}},
		then.Events...)
	return then
}

// notBound says why s may not have the row its row-uid annotation names: it records
// another Student or owner; or, for a write, it is missing (writing it would take another
// system's key on an annotation's word alone). "" if bound to s, or absent and no write.
func notBound(f Facts, write bool) string {
	s, rec := f.Student, f.Row.Record
	names := fmt.Sprintf("the row %s that annotation %s names", s.RowKey, studentv1.AnnotationRowUID)
	switch read := f.Row.Read; {
	case read == Absent && write:
		return names + " is missing (deleted by the system that wrote it, or by hand): put it back, " +
			"or remove the annotation to give the Student a row of its own uid"
	case read == Absent:
		return ""
	case read == Malformed:
		return names + " cannot be read, so whose it is cannot be told"
	case rec.StudentUID == s.UID:
		return ""
	case rec.Namespace != s.Namespace || rec.Name != s.Name:
		return fmt.Sprintf("%s is Student %s/%s's, not this one's: the annotation was copied or set by hand; "+
			"remove it to give this Student a row of its own uid", names, rec.Namespace, rec.Name)
	case rec.Owner != "" && rec.Owner != f.Owner:
		return fmt.Sprintf("%s is %s", names, OwnedBy(rec))
	}
	if rec.Owner == "" {
		return fmt.Sprintf("%s has no owner and no binding to this Student, and this owner's history does not show it as its own "+
			"(an older backup put back, or the annotation set by hand): if it is this Student's row, bind it with student-controller registry adopt", names)
	}
	return fmt.Sprintf("%s was bound to Student %s of this namespace and name, which is gone (made again, or its cluster rebuilt): "+
		"bind the row to this one with student-controller registry adopt", names, cmp.Or(rec.StudentUID, rec.UID))
}

// observe compares and reports an observed Student's row, never writing it but for one
// mark: a row this controller managed is marked observed, so no orphan path lets it go.
func observe(f Facts) Decision {
	s, row := f.Student, f.Row
	if row.Read == Unread {
		return ask(AskRow)
	}
	var d Decision
	if row.Read == Found && row.Record.Owner == f.Owner && row.Record.Management != registry.ManagementObserve {
		d = d.with(Action{Op: MarkObserved, Record: row.Record, Why: registry.Why{Cause: registry.CauseObserved}})
	}
	differs := Drift(row.Record, row.Read == Found, row.Read == Malformed, s.Namespace, s.Name, s.Spec)
	drifted := differs != ""
	d.Status = &Status{Ready: true, Reason: studentv1.ReasonInLine, Drifted: &drifted,
		Message: "The registry row matches the spec; the Student is observed, so the controller does not write it"}
	switch {
	case drifted:
		d.Status.Ready, d.Status.Reason = false, studentv1.ReasonDrifted
		d.Status.Message = "The registry row differs from the spec: " + differs + ". The Student is observed, so the controller does not write it; " +
			"set spec.management to Manage to bring the row in line"
		d.Why = differs
		if !s.Drifted {
			d.Events = []Event{{Warning: true, Reason: EventDrifted, Message: d.Status.Message}}
		}
	case s.Drifted:
		d.Events = []Event{{Reason: EventInLine, Message: "The registry row matches the spec again"}}
	}
	return d
}

// Drift says how an observed Student's row differs from its spec, "" if not. It compares
// only student fields, not generation, owner, policy: an observed row is its writer's.
func Drift(row registry.Record, found, malformed bool, namespace, name string, spec studentv1.StudentSpec) string {
	switch {
	case malformed:
		return "the registry row cannot be read"
	case !found:
		return "the registry has no row for this Student"
	}
	var diffs []string
	if row.Namespace != namespace || row.Name != name {
		diffs = append(diffs, fmt.Sprintf("the row names the Student %s/%s", row.Namespace, row.Name))
	}
	if row.StudentName != spec.Name {
		diffs = append(diffs, fmt.Sprintf("student_name is %q, spec.name %q", row.StudentName, spec.Name))
	}
	if row.School != spec.School {
		diffs = append(diffs, fmt.Sprintf("school is %q, spec.school %q", row.School, spec.School))
	}
	return strings.Join(diffs, "; ")
}

// finalize decides for a deleting Student: its row is deleted or released per its policy,
// or left if not its own to let go; then the Student goes. The row is read first, so the
// finalizer does what plan says; the SQL guards the same against a race.
func finalize(f Facts) Decision {
	s, row := f.Student, f.Row
	done := Action{Op: RemoveFinalizer}
	if row.Read == Unread {
		return ask(AskRow)
	}
	leave := func(reason, msg string) Decision {
		return Decision{Actions: []Action{done}, Why: "left alone: " + msg,
			Events: []Event{{Warning: true, Reason: reason, Message: "Registry row left alone: " + msg}}}
	}
	if s.NamesRow() {
		if problem := notBound(f, false); problem != "" {
			return leave(EventRowNotBound, problem)
		}
	}
	rec := row.Record
	ours := row.Read == Found && rec.Owner == f.Owner
	switch {
	case row.Refused != "":
		return leave(EventRowOwnedElsewhere, row.Refused)
	case s.Observed():
		d := Decision{Actions: []Action{done}, Why: "observed: the row is left as it is"}
		if ours && rec.Management != registry.ManagementObserve {
			d.Actions = []Action{{Op: MarkObserved, Record: rec, Why: registry.Why{Cause: registry.CauseObserved}}, done}
		}
		return d
	case row.Read == Absent:
		return Decision{Actions: []Action{done}, Why: "no row"}
	case row.Read == Found && !ours:
		return leave(EventRowOwnedElsewhere, fmt.Sprintf("row %s is %s", rec.UID, OwnedBy(rec)))
	case ours && rec.Management == registry.ManagementObserve:
		// Switched to Manage and deleted before a sync managed the row again.
		return leave(EventRowOwnedElsewhere, fmt.Sprintf("row %s is observed", rec.UID))
	}
	return letGo(f, done)
}

// letGo decides how the finalizer lets go of its own row, per both policies.
func letGo(f Facts, done Action) Decision {
	s, row, rec := f.Student, f.Row, f.Row.Record
	want := Want(f.Owner, s)
	letGo := func(op Op, cause string) Decision {
		return Decision{Actions: []Action{{Op: op, Record: want, Why: registry.Why{Cause: cause}}, done}}
	}
	switch {
	case s.Policy() != studentv1.DeletionPolicyDelete && s.Spec.Validate() != "" && row.Read == Found:
		// A spec the registry cannot hold: the row keeps its values as last written.
		want.StudentName, want.School, want.Generation = rec.StudentName, rec.School, rec.Generation
		return letGo(Release, registry.CauseFinalizer)
	case row.Read == Malformed && s.Policy() != studentv1.DeletionPolicyDelete:
		// Its values cannot be read: released as it stands.
		return letGo(Relinquish, registry.CauseFinalizer)
	case s.Policy() != studentv1.DeletionPolicyDelete && rec.Generation > want.Generation:
		// Ahead of the Student (an etcd restore): rewound first, then released.
		return undo(f, Decision{}, Action{Op: Rewind, Record: want, Ahead: rec.Generation, Undo: true})
	case s.Policy() != studentv1.DeletionPolicyDelete && row.Stale:
		return Decision{Result: Retry, Why: "the row changed since its write was refused"}
	case s.Policy() != studentv1.DeletionPolicyDelete:
		// Orphan, or a policy now refused (stored before): keeping the row can be undone.
		return letGo(Release, registry.CauseFinalizer)
	case f.RegistryBehind:
		// Registry gone back in time: destroy nothing; release for prune once confirmed.
		return letGo(Relinquish, registry.CauseRegistryBehind)
	case f.CRD == CRDUnasked:
		return ask(AskCRD)
	case f.CRD == CRDDeleting:
		// Deleted with its CRD, not by a user: absence, so released as it stands.
		return letGo(Relinquish, registry.CauseCRDDeleted)
	case row.Read == Found && rec.DeletionPolicy != registry.PolicyDelete:
		// The row records another policy (an older backup put back): it goes as recorded.
		return letGo(Relinquish, registry.CauseFinalizer)
	}
	// A row that cannot be read goes by the policy stored in it, which the SQL checks.
	return letGo(Delete, registry.CauseFinalizer)
}

// Unavailable is the status of a Student whose sync the registry failed (retried). Its
// message is fixed: the cause (hosts, users, files) goes to the log only.
func Unavailable(s Student) (Status, Event) {
	msg := "The registry did not answer or refused the write; the controller retries (its log has the cause)"
	if s.Deleting {
		msg = "Waiting for the registry to let the row go; the controller retries (its log has the cause)"
	}
	return Status{Reason: studentv1.ReasonRegistryUnavailable, Message: msg},
		Event{Warning: true, Reason: EventRegistryError, Message: msg, OnChange: true}
}
