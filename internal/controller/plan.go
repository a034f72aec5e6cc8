package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/student-controller/student-controller/internal/decide"
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// Plan actions: the row writes (create, update, restore, delete, release), add-finalizer,
// and finalize (only a Terminating Student's finalizer comes off). refuse, drifted (an
// observed Student's row differs from its spec) and prunable (released with policy Delete;
// only registry prune deletes it) are only reported. Status writes are not planned.
const (
	PlanAddFinalizer = "add-finalizer"
	PlanCreate       = "create"
	PlanUpdate       = "update"
	PlanRestore      = "restore"
	PlanDelete       = "delete"
	PlanRelease      = "release"
	PlanFinalize     = "finalize"
	PlanRefuse       = "refuse"
	PlanDrifted      = "drifted"
	PlanPrunable     = "prunable"
)

// PlannedAction is one thing the controller would do now, or refuse to do.
type PlannedAction struct {
	Action    string `json:"action"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	Cause     string `json:"cause"` // why: the history row's cause for a write, or what blocks a refusal
}

// Plan is what the controller would do now: the registry compared with the Students.
type Plan struct {
	Actions []PlannedAction `json:"actions"` // ordered by namespace, name and UID
	// Students and Rows were compared; Paused ones get no action; Malformed are unreadable.
	Students  int `json:"students"`
	Rows      int `json:"rows"`
	Paused    int `json:"paused"`
	Malformed int `json:"malformed"`
	// Orphans are owned rows without a Student; SweepRefused: past SweepBound, they stay.
	Orphans      int  `json:"orphans"`
	SweepBound   int  `json:"sweepBound"`
	SweepRefused bool `json:"sweepRefused"`
	Prunable     int  `json:"prunable"` // the prunable actions
}

// Changes counts the actions that would change something: not refuse, drifted, prunable.
func (p Plan) Changes() int { return changes(p.Actions) }

// sortActions orders actions by namespace, name and UID; stably, so that a Student's
// finalizer comes before its row.
func sortActions(actions []PlannedAction) {
	slices.SortStableFunc(actions, func(a, b PlannedAction) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
}

func changes(actions []PlannedAction) int {
	n := 0
	for _, a := range actions {
		if a.Action != PlanRefuse && a.Action != PlanDrifted && a.Action != PlanPrunable {
			n++
		}
	}
	return n
}

// PlanPolicy is what a plan plans under: the controller's owner, bounds and facts.
type PlanPolicy struct {
	Owner string
	// SweepMaxDeletions and SweepMaxDeletionPercent bound the sweep (Config); NoSweep: it
	// is off (--sweep-interval=0), so orphan rows stay.
	SweepMaxDeletions, SweepMaxDeletionPercent int
	NoSweep                                    bool
	// CRD is the served CRD's state (current when unset); CRDOlder: it lacks our fields.
	CRD      decide.CRD
	CRDOlder bool
	// RegistryBehind says the registry is behind the cluster's mark, unconfirmed.
	RegistryBehind bool
	// MaxUndo is the bound of rows undone (Config.MaxRewinds), 100 when unset.
	MaxUndo int
}

// PlanInput is what a plan compares.
type PlanInput struct {
	PlanPolicy
	// Students are the Students in scope, as the API server has them now.
	Students []*studentv1.Student
	// Rows are the rows Owner holds, in scope; Malformed the ones it cannot read.
	Rows      []registry.Record
	Malformed []registry.MalformedRow
	// Others are the stored rows of in-scope Students that Owner does not hold, by UID.
	Others map[string]registry.Record
	// Released are the rows Owner released that nobody has taken since, in scope.
	Released []registry.Record
	// History is the last history row, by row uid, of rows missing or with a lost binding.
	History map[string]registry.HistoryEntry
}

// ComputePlan is what the controller's syncs and sweep would do for in: a pure function.
func ComputePlan(in PlanInput) Plan {
	plan := Plan{Students: len(in.Students), Rows: len(in.Rows), Malformed: len(in.Malformed)}
	rows := in.rowFacts()
	maxUndo := cmp.Or(in.MaxUndo, defaultMaxRewinds)
	undone := 0
	seen := make(map[string]bool, len(in.Students))
	for _, s := range in.Students {
		f := studentFacts(in.Owner, s)
		seen[f.Student.RowKey] = true
		f.Row = cmp.Or(rows[f.Student.RowKey], decide.Row{Read: decide.Absent})
		f.UndoLeft, f.MaxUndo, f.CRDOlder = undone < maxUndo, maxUndo, in.CRDOlder
		f.RegistryBehind = f.Student.Deleting && in.RegistryBehind
		d, err := decide.Settle(&f, in.answer)
		if err != nil {
			plan.Actions = append(plan.Actions, PlannedAction{Action: PlanRefuse, Namespace: s.Namespace, Name: s.Name, UID: string(s.UID), Cause: err.Error()})
			continue
		}
		if d.Status != nil && d.Status.Paused {
			plan.Paused++
			continue
		}
		for _, a := range d.Actions {
			if a.Undo {
				undone++ // the bound holds across Students, as the sync's counter does
			}
		}
		plan.Actions = append(plan.Actions, planned(s, d)...)
	}
	plan.sweep(in, seen)
	sortActions(plan.Actions)
	return plan
}

// rowFacts is each row by uid, as a sync would read it first.
func (in PlanInput) rowFacts() map[string]decide.Row {
	rows := make(map[string]decide.Row, len(in.Rows)+len(in.Malformed)+len(in.Others))
	for _, r := range in.Rows {
		rows[r.UID] = decide.Row{Read: decide.Found, Record: r}
	}
	for _, m := range in.Malformed {
		rows[m.UID] = decide.Row{Read: decide.Malformed}
	}
	for uid, r := range in.Others {
		rows[uid] = decide.Row{Read: decide.Found, Record: r}
	}
	return rows
}

// answer answers a decision's question from in; its Students are current (quorum).
func (in PlanInput) answer(a decide.Ask, f *decide.Facts) error {
	switch a {
	case decide.AskQuorum:
		f.Quorum = decide.QuorumCurrent
	case decide.AskHistory:
		e, ok := in.History[f.Student.RowKey]
		f.History, f.Deleted = decide.HistoryOf(f.Owner, e, ok), e
	case decide.AskCRD:
		f.CRD = cmp.Or(in.CRD, decide.CRDCurrent)
	default:
		return fmt.Errorf("a plan cannot answer the decision's question %d", a)
	}
	return nil
}

func planned(s *studentv1.Student, d decide.Decision) []PlannedAction {
	var out []PlannedAction
	add := func(action, cause string) {
		out = append(out, PlannedAction{Action: action, Namespace: s.Namespace, Name: s.Name, UID: string(s.UID), Cause: cause})
	}
	letsGo := false
	for _, a := range d.Actions {
		switch a.Op {
		case decide.AddFinalizer:
			add(PlanAddFinalizer, "before the row is written")
		case decide.Insert, decide.Upsert:
			add(cmp.Or(planActions[a.Why.Action], PlanUpdate), a.Why.Cause)
		case decide.Rewind:
			add(PlanUpdate, registry.CauseRegistryAhead)
		case decide.TakeBack:
			add(PlanRestore, registry.CauseTakenBack)
		case decide.MarkObserved:
			add(PlanUpdate, "observed: the row is marked so, and nothing else of it changes")
		case decide.Rebind:
			add(PlanUpdate, "the row lost its binding to this Student: it is bound again")
		case decide.RecordPolicy:
			add(PlanUpdate, "its deletion policy is recorded")
		case decide.Delete:
			letsGo = true
			add(PlanDelete, a.Why.Cause)
		case decide.Release, decide.Relinquish:
			letsGo = true
			add(PlanRelease, a.Why.Cause)
		case decide.RemoveFinalizer:
			if !letsGo {
				add(PlanFinalize, d.Why)
			}
		}
	}
	switch {
	case d.Result != decide.Done:
		add(PlanRefuse, d.Why)
	case d.Status != nil && d.Status.Drifted != nil && *d.Status.Drifted:
		add(PlanDrifted, d.Why)
	}
	return out
}

// sweep plans the orphan rows (no Student in seen) as the sweep would, and prunable rows.
func (plan *Plan) sweep(in PlanInput, seen map[string]bool) {
	var orphans []registry.Record
	for i, r := range in.Rows {
		if !seen[r.UID] && decide.Sweep(in.Owner, &in.Rows[i], nil) == decide.SweepRelease {
			orphans = append(orphans, r)
		}
	}
	plan.Orphans = len(orphans)
	plan.SweepBound = decide.SweepBound(in.SweepMaxDeletions, in.SweepMaxDeletionPercent, len(in.Rows))
	hold := decide.SweepHolds(len(orphans), plan.SweepBound, in.RegistryBehind)
	plan.SweepRefused = !in.NoSweep && hold == decide.SweepPastBound
	for _, r := range orphans {
		a := PlannedAction{Action: PlanRefuse, Namespace: r.Namespace, Name: r.Name, UID: r.UID}
		switch {
		case in.NoSweep:
			a.Cause = "the sweep is off (--sweep-interval=0): the row stays"
		case hold == decide.SweepPastBound:
			a.Cause = fmt.Sprintf("the sweep's guard: %d owned rows without a Student, more than it lets go at once (%d)", len(orphans), plan.SweepBound)
		case hold == decide.SweepRegistryBehind:
			a.Cause = "the registry is behind the cluster's mark, unconfirmed: the row stays"
		default:
			a.Action, a.Cause = PlanRelease, registry.CauseSweep
		}
		plan.Actions = append(plan.Actions, a)
	}
	for _, r := range in.Released {
		if !seen[r.UID] && registry.Prunable(r, in.Owner) {
			plan.Prunable++
			plan.Actions = append(plan.Actions, PlannedAction{Action: PlanPrunable, Namespace: r.Namespace, Name: r.Name, UID: r.UID,
				Cause: "released without its Student (" + r.ReleaseCause + ") while its policy was Delete: student-controller registry prune deletes it"})
		}
	}
}

// planActions name a row write's action in a plan; any other is an update.
var planActions = map[string]string{rowCreated: PlanCreate, rowRestored: PlanRestore}

// PlanScope says what a plan compares: whose rows, of which Students, the sweep's bound.
type PlanScope struct {
	PlanPolicy
	// Scope limits rows to its namespaces (--namespace); the Students given must be in it.
	Scope Scope
	// Exists says whether a row's Student exists. With a label selector, an owned row whose
	// Student is not given but exists (outside the selector) keeps its row, out of scope.
	Exists func(ctx context.Context, row registry.Record) (bool, error)
}

// PlanFor reads (never writes) what ComputePlan compares: the rows scope.Owner holds in
// scope, and the stored row of each of students (in scope, current) it does not hold.
func PlanFor(ctx context.Context, rows rowReader, scope PlanScope, students []*studentv1.Student) (Plan, error) {
	in := PlanInput{PlanPolicy: scope.PlanPolicy, Students: students, Others: map[string]registry.Record{}, History: map[string]registry.HistoryEntry{}}
	owned, malformed, err := rows.List(ctx, scope.Owner)
	if err != nil {
		return Plan{}, err
	}
	// All rows the owner holds, in any namespace: rowsIn filters owned in place.
	held := make(map[string]bool, len(owned)+len(malformed))
	for _, r := range owned {
		held[r.UID] = true
	}
	in.Rows = scope.Scope.rowsIn(owned)
	if scope.Scope.Labeled() {
		if scope.Exists == nil {
			return Plan{}, errors.New("a plan with a label selector needs PlanScope.Exists")
		}
		if in.Rows, err = withoutOutOfScope(ctx, in.Rows, students, scope.Exists); err != nil {
			return Plan{}, err
		}
	}
	for _, m := range malformed {
		held[m.UID] = true
		in.Malformed = append(in.Malformed, m)
	}
	released, _, err := rows.ListReleased(ctx, scope.Owner)
	if err != nil {
		return Plan{}, err
	}
	in.Released = scope.Scope.rowsIn(released)
	if err := in.readOthers(ctx, rows, students, held); err != nil {
		return Plan{}, err
	}
	return ComputePlan(in), nil
}

// readOthers reads the row of each of students that the owner does not hold, and its
// last history row where the decision asks for it: the decision drives the reads.
func (in *PlanInput) readOthers(ctx context.Context, rows rowReader, students []*studentv1.Student, held map[string]bool) error {
	for _, s := range students {
		key := RowUID(s)
		if held[key] {
			continue
		}
		row, err := rows.Get(ctx, key)
		f := studentFacts(in.Owner, s)
		f.Row, f.UndoLeft, f.CRDOlder = decide.Row{Read: decide.Found, Record: row}, true, in.CRDOlder
		switch {
		case errors.Is(err, registry.ErrNotFound):
			f.Row = decide.Row{Read: decide.Absent}
		case errors.Is(err, registry.ErrMalformed):
			// Unreadable, and not the owner's (List has those): refused as another's row.
			f.Row.Record = registry.Record{UID: key, Owner: "(unreadable)"}
		case err != nil:
			return err
		}
		if f.Row.Read == decide.Found {
			in.Others[key] = f.Row.Record
		}
		_, err = decide.Settle(&f, func(a decide.Ask, f *decide.Facts) error {
			if a != decide.AskHistory {
				return in.answer(a, f)
			}
			last, ok, err := rows.LastHistory(ctx, s.Namespace, s.Name, key)
			if ok {
				in.History[key] = last
			}
			f.History, f.Deleted = decide.HistoryOf(f.Owner, last, ok), last
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// withoutOutOfScope drops the rows whose Student exists outside the label selector.
func withoutOutOfScope(ctx context.Context, rows []registry.Record, students []*studentv1.Student,
	exists func(context.Context, registry.Record) (bool, error)) ([]registry.Record, error) {
	given := make(map[string]bool, len(students))
	for _, s := range students {
		given[RowUID(s)] = true
	}
	kept := rows[:0]
	for _, r := range rows {
		if !given[r.UID] {
			live, err := exists(ctx, r)
			if err != nil {
				return nil, err
			}
			if live {
				continue
			}
		}
		kept = append(kept, r)
	}
	return kept, nil
}
