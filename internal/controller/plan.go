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

// The actions of a plan: the row writes a sync or a sweep makes (create, update,
// restore, delete, release), the finalizer put on a Student that lacks it
// (add-finalizer), a Terminating Student whose finalizer alone comes off (finalize),
// what the controller refuses (refuse), an observed Student whose row differs from its
// spec (drifted: reported, never written), and a row the owner released without its
// Student while it recorded Delete (prunable: only student-controller registry prune
// deletes it, when asked). Status writes are not planned.
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
	// Cause says why: the cause its history row would record for a row write, what
	// stands in the way for a refusal.
	Cause string `json:"cause"`
}

// Plan is what the controller would do now: the diff of the registry against the
// Students, as its syncs and its sweep would act on it.
type Plan struct {
	// Actions, ordered by namespace, name and UID.
	Actions []PlannedAction `json:"actions"`
	// Students and Rows are what was compared: the Students in scope and the rows the
	// owner holds in scope. Paused are the Students held still (no action is planned
	// for them); Malformed the owned rows that cannot be read.
	Students  int `json:"students"`
	Rows      int `json:"rows"`
	Paused    int `json:"paused"`
	Malformed int `json:"malformed"`
	// Orphans are owned rows whose Student is gone. SweepRefused says the sweep's
	// guard would refuse to let go of them (more than SweepBound at once): they are
	// planned as refused, and stay.
	Orphans      int  `json:"orphans"`
	SweepBound   int  `json:"sweepBound"`
	SweepRefused bool `json:"sweepRefused"`
	// Prunable are the rows the owner released without their Students while they
	// recorded Delete: kept until student-controller registry prune deletes them.
	Prunable int `json:"prunable"`
}

// Changes counts the actions that would change something (all but refusals, drift
// and prunable rows, which are only reported).
func (p Plan) Changes() int { return changes(p.Actions) }

// changes counts the actions of a plan or an adoption plan that change something: all
// but refusals and drift, which is only reported.
func changes(actions []PlannedAction) int {
	n := 0
	for _, a := range actions {
		if a.Action != PlanRefuse && a.Action != PlanDrifted && a.Action != PlanPrunable {
			n++
		}
	}
	return n
}

// PlanInput is what a plan compares.
type PlanInput struct {
	Owner string
	// Students are the Students in scope, as the API server has them now.
	Students []*studentv1.Student
	// Rows are the rows Owner holds, in scope; Malformed the ones it cannot read.
	Rows      []registry.Record
	Malformed []registry.MalformedRow
	// Others are the stored rows of Students in scope that Owner does not hold
	// (another owner's, or released), by UID.
	Others map[string]registry.Record
	// SweepMaxDeletions and SweepMaxDeletionPercent are the sweep's bound (Config).
	SweepMaxDeletions, SweepMaxDeletionPercent int
	// NoSweep says the sweep is off (Config.SweepInterval 0): orphan rows stay.
	NoSweep bool
	// Released are the rows Owner released that nobody has taken since, in scope.
	Released []registry.Record
	// History are the last history rows, by row uid, of the rows of Students in scope
	// whose decision asks for it: missing after they were written, or their binding lost.
	History map[string]registry.HistoryEntry
	// CRD is the state of the served Student CRD, current when unset; CRDOlder says
	// it lacks fields the controller writes.
	CRD      decide.CRD
	CRDOlder bool
	// RegistryBehind says the registry is behind the cluster's mark, unconfirmed.
	RegistryBehind bool
	// MaxUndo is the bound of rows undone (Config.MaxRewinds), 100 when unset.
	MaxUndo int
}

// ComputePlan says what the controller would do for in: each Student as its sync
// decides (decide.Settle, over the row read first), and the orphan rows as the sweep
// would. It is a pure function of its input.
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
	// Stable: a Student's finalizer comes before its row.
	slices.SortStableFunc(plan.Actions, func(a, b PlannedAction) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
	return plan
}

// rowFacts is what the plan knows of each row, by uid: read first, as a sync would
// find it. A row of another owner that cannot be read is refused as theirs.
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

// answer is the plan's answer to what a decision asks for: the API server holds what
// the plan compares, the history is in.History and the CRD in.CRD.
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

// planned is what a decision for s does, as a plan lists it.
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
			add(planAction(a.Why.Action), a.Why.Cause)
		case decide.Rewind:
			add(PlanUpdate, registry.CauseRegistryAhead)
		case decide.TakeBack:
			add(PlanRestore, registry.CauseTakenBack)
		case decide.MarkObserved:
			add(PlanUpdate, planMarkObserved)
		case decide.Rebind:
			add(PlanUpdate, planRebind)
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

// sweep plans the rows without a Student in seen, as the sweep would let them go,
// and the rows registry prune would delete.
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
	plan.SweepRefused = !in.NoSweep && hold != decide.SweepLetsGo
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

// planMarkObserved is the cause of the one write an observed Student makes: the mark of
// a row it managed until then.
const planMarkObserved = "observed: the row is marked so, and nothing else of it changes"

// planRebind is the cause of the write that binds a row to its Student again.
const planRebind = "the row lost its binding to this Student: it is bound again"

// planAction is the plan's name of a row write's action.
func planAction(action string) string {
	switch action {
	case rowCreated:
		return PlanCreate
	case rowRestored:
		return PlanRestore
	}
	return PlanUpdate
}

// PlanScope is what a plan compares: whose rows, of which Students, and the sweep's
// bound.
type PlanScope struct {
	Owner string
	// Scope limits the rows to those of its namespaces (the controller's --namespace);
	// the Students given must be those of the Scope.
	Scope                                      Scope
	SweepMaxDeletions, SweepMaxDeletionPercent int
	// NoSweep says the controller does not sweep (--sweep-interval=0).
	NoSweep bool
	// CRD is the state of the served Student CRD, current when unset (CRDOlder: it
	// lacks fields); MaxUndo the bound of rows undone (--registry-max-rewinds), 100
	// when unset.
	CRD            decide.CRD
	CRDOlder       bool
	RegistryBehind bool
	MaxUndo        int
	// Exists asks the API server whether a row's Student is there. With a label
	// selector it is asked of each owned row whose Student is not among those given:
	// a Student there outside the selector keeps its row, out of scope.
	Exists func(ctx context.Context, row registry.Record) (bool, error)
}

// PlanFor reads what ComputePlan compares from the registry, only reading: the rows
// scope.Owner holds in scope, and the stored row of each Student it does not hold.
// students are the Students in scope, as the API server has them now.
func PlanFor(ctx context.Context, rows rowReader, scope PlanScope, students []*studentv1.Student) (Plan, error) {
	in := PlanInput{Owner: scope.Owner, Students: students, Others: map[string]registry.Record{}, History: map[string]registry.HistoryEntry{},
		SweepMaxDeletions: scope.SweepMaxDeletions, SweepMaxDeletionPercent: scope.SweepMaxDeletionPercent, NoSweep: scope.NoSweep,
		CRD: scope.CRD, CRDOlder: scope.CRDOlder, RegistryBehind: scope.RegistryBehind, MaxUndo: scope.MaxUndo}
	owned, malformed, err := rows.List(ctx, scope.Owner)
	if err != nil {
		return Plan{}, err
	}
	// Every row the owner holds, of any namespace, before rowsIn filters owned in place.
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

// readOthers reads the row of each of students whose row is not held by the owner:
// another owner's, released, unreadable or missing; and, for a missing row written
// before, its last history row when that is a delete.
func (in *PlanInput) readOthers(ctx context.Context, rows rowReader, students []*studentv1.Student, held map[string]bool) error {
	for _, s := range students {
		key := RowUID(s)
		if held[key] {
			continue
		}
		row, err := rows.Get(ctx, key)
		switch {
		case errors.Is(err, registry.ErrNotFound) && wasWritten(s), err == nil && decide.BindingLost(row, true, studentFacts(in.Owner, s).Student):
			// Missing after it was written (restored, unless its finalizer deleted it),
			// or its binding lost (bound again if the history says it was the owner's).
			last, ok, err := rows.LastHistory(ctx, s.Namespace, s.Name, key)
			if err != nil {
				return err
			}
			if ok {
				in.History[key] = last
			}
			if row.UID != "" {
				in.Others[row.UID] = row
			}
		case errors.Is(err, registry.ErrNotFound):
			// Missing: created.
		case errors.Is(err, registry.ErrMalformed):
			// Unreadable and not the owner's (List has the owner's): the upsert is
			// refused, as for any row of another owner.
			in.Others[key] = registry.Record{UID: key, Owner: "(unreadable)"}
		case err != nil:
			return err
		default:
			in.Others[row.UID] = row
		}
	}
	return nil
}

// withoutOutOfScope drops the rows whose Student is not among students but exists:
// outside the label selector.
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
