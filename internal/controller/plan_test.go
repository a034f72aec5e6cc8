package controller

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// The plan says what the controller then does: every kind of action planned, then
// each Student synced and a sweep run, and the history the registry kept of those
// writes is the plan's row writes, one for one.
func TestPlanIsWhatTheControllerDoes(t *testing.T) {
	changed := newStudent("changed", withFinalizer, synced(start), func(s *studentv1.Student) {
		s.Generation, s.Spec.School = 2, "another school"
	})
	invalid := newStudent("invalid", withFinalizer, func(s *studentv1.Student) { s.Spec.Name = "tab\there" })
	f := newFixture(t,
		newStudent("new"),
		changed,
		newStudent("tampered", withFinalizer, synced(start)),
		newStudent("lost", withFinalizer, synced(start)),
		newStudent("inline", withFinalizer, synced(start)),
		newStudent("held", withFinalizer, synced(start), pausedBy),
		newStudent("bye", withFinalizer, synced(start), deleting),
		newStudent("keep", withFinalizer, synced(start), orphan, deleting),
		newStudent("rowless", withFinalizer, deleting),
		newStudent("theirs"),
		invalid,
		// Its row was released by this owner (its finalizer ran, then an etcd restore
		// brought it back): taken back.
		newStudent("reborn", withFinalizer, synced(start)),
		// Delete, deleted, and its row says Orphan (an older backup put back): released.
		newStudent("bye-kept", withFinalizer, synced(start), deleting),
	)
	tampered := recordOf(owner, newStudent("tampered"))
	tampered.StudentName = "someone else"
	held := recordOf(owner, newStudent("held"))
	held.School = "edited by hand"
	f.put(
		recordOf(owner, newStudent("changed")), tampered, recordOf(owner, newStudent("inline")), held,
		recordOf(owner, newStudent("bye")), recordOf(owner, newStudent("keep", orphan)),
		recordOf("another-controller", newStudent("theirs")),
		recordOf(owner, newStudent("ghost")), recordOf(owner, newStudent("ghost-kept", orphan)),
		recordOf(owner, newStudent("reborn")), recordOf(owner, newStudent("bye-kept", orphan)),
	)
	if _, err := f.registry.Release(f.ctx, recordOf(owner, newStudent("reborn")), registry.CauseFinalizer); err != nil {
		t.Fatal(err)
	}
	var students []*studentv1.Student
	for _, s := range f.ctrl.students.list() {
		students = append(students, s.student())
	}
	scope := PlanScope{PlanPolicy: PlanPolicy{Owner: owner, SweepMaxDeletions: 2, SweepMaxDeletionPercent: 50}}
	plan, err := PlanFor(f.ctx, f.registry, scope, students)
	if err != nil {
		t.Fatal(err)
	}
	want := []PlannedAction{
		{Action: PlanDelete, Name: "bye", Cause: registry.CauseFinalizer},
		{Action: PlanRelease, Name: "bye-kept", Cause: registry.CauseFinalizer},
		{Action: PlanUpdate, Name: "changed", Cause: registry.CauseSpecChange},
		{Action: PlanRelease, Name: "ghost", Cause: registry.CauseSweep},
		{Action: PlanRelease, Name: "ghost-kept", Cause: registry.CauseSweep},
		{Action: PlanRefuse, Name: "invalid", Cause: "invalid spec: spec.name must not hold control characters (U+0000 to U+001F, U+007F)"},
		{Action: PlanRelease, Name: "keep", Cause: registry.CauseFinalizer},
		{Action: PlanRestore, Name: "lost", Cause: registry.CauseRestore},
		{Action: PlanAddFinalizer, Name: "new", Cause: "before the row is written"},
		{Action: PlanCreate, Name: "new", Cause: registry.CauseNewStudent},
		{Action: PlanRestore, Name: "reborn", Cause: registry.CauseTakenBack},
		{Action: PlanFinalize, Name: "rowless", Cause: "no row"},
		{Action: PlanUpdate, Name: "tampered", Cause: registry.CauseDrift},
		{Action: PlanAddFinalizer, Name: "theirs", Cause: "before the row is written"},
		{Action: PlanRefuse, Name: "theirs", Cause: `the row is owned by "another-controller"`},
	}
	for i := range want {
		want[i].Namespace, want[i].UID = "school", "uid-"+want[i].Name
	}
	if diff := cmp.Diff(want, plan.Actions); diff != "" {
		t.Errorf("plan (-want +got):\n%s", diff)
	}
	if plan.Students != 13 || plan.Rows != 9 || plan.Paused != 1 || plan.Orphans != 2 || plan.SweepRefused || plan.Changes() != 13 {
		t.Errorf("plan counts: %+v, %d changes", plan, plan.Changes())
	}

	// What the controller does: each Student synced, then a sweep.
	last := f.historyLength()
	for _, s := range students {
		_ = f.ctrl.sync(f.ctx, s.Namespace+"/"+s.Name) // the refusals return their errors
	}
	if _, err := f.ctrl.Sweep(f.ctx); err != nil {
		t.Fatal(err)
	}
	var planned []string
	for _, a := range plan.Actions {
		if history := historyAction(a.Action); history != "" {
			planned = append(planned, fmt.Sprintf("%s %s %s", a.UID, history, a.Cause))
		}
	}
	if diff := cmp.Diff(planned, f.historySince(last)); diff != "" {
		t.Errorf("the plan's row writes (-) against the history of what the controller wrote (+):\n%s", diff)
	}
	// The sweep released ghost, whose policy was Delete: the next plan lists it for
	// registry prune, and plans no change for it.
	again, err := PlanFor(f.ctx, f.registry, scope, nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Prunable != 1 || !slices.ContainsFunc(again.Actions, func(a PlannedAction) bool { return a.Action == PlanPrunable && a.Name == "ghost" }) {
		t.Errorf("the plan after the sweep: %+v; want ghost prunable", again)
	}
	if got := f.get("school", "rowless").Finalizers; len(got) != 0 {
		t.Errorf("the finalizer of the Student planned to be finalized: %v", got)
	}
	for _, name := range []string{"new", "theirs"} {
		if got := f.get("school", name).Finalizers; !slices.Contains(got, Finalizer) {
			t.Errorf("the finalizer of Student %s, planned to be added: %v", name, got)
		}
	}
}

// historyAction is the history's action of a planned one: "" for what writes no row.
func historyAction(action string) string {
	switch action {
	case PlanCreate:
		return registry.ActionCreated
	case PlanUpdate:
		return registry.ActionUpdated
	case PlanRestore:
		return registry.ActionRestored
	case PlanDelete:
		return registry.ActionDeleted
	case PlanRelease:
		return registry.ActionReleased
	}
	return ""
}

func TestComputePlan(t *testing.T) {
	tests := map[string]struct {
		in          PlanInput
		wantActions []string
		wantRefused bool
	}{
		"nothing to do": {
			in: PlanInput{Students: []*studentv1.Student{newStudent("a", withFinalizer, synced(start))}, Rows: []registry.Record{recordOf(owner, newStudent("a"))}},
		},
		"a row written before rows recorded their policy": {
			in:          PlanInput{Students: []*studentv1.Student{newStudent("a", withFinalizer, synced(start))}, Rows: []registry.Record{unknownPolicy(recordOf(owner, newStudent("a")))}},
			wantActions: []string{"update a: its deletion policy is recorded"},
		},
		"an unreadable row of the owner is rewritten": {
			in: PlanInput{Students: []*studentv1.Student{newStudent("a", withFinalizer, synced(start))},
				Malformed: []registry.MalformedRow{{UID: "uid-a", Problem: "generation is text"}}},
			wantActions: []string{"update a: drift"},
		},
		"a Terminating Student's unreadable row goes with it": {
			in: PlanInput{Students: []*studentv1.Student{newStudent("a", withFinalizer, deleting)},
				Malformed: []registry.MalformedRow{{UID: "uid-a", Problem: "generation is text"}}},
			wantActions: []string{"delete a: " + registry.CauseFinalizer},
		},
		"a released row is refused": {
			in: PlanInput{Students: []*studentv1.Student{newStudent("a", withFinalizer)},
				Others: map[string]registry.Record{"uid-a": {UID: "uid-a"}}},
			wantActions: []string{"refuse a: the row is released"},
		},
		"a Terminating Student without the finalizer is not this controller's": {
			in: PlanInput{Students: []*studentv1.Student{newStudent("a", deleting, func(s *studentv1.Student) { s.Finalizers = []string{"other"} })}},
		},
		"a paused Terminating Student waits": {
			in: PlanInput{Students: []*studentv1.Student{newStudent("a", withFinalizer, deleting, pausedBy)}, Rows: []registry.Record{recordOf(owner, newStudent("a"))}},
		},
		"a new Student without the finalizer gets it, then its row": {
			in:          PlanInput{Students: []*studentv1.Student{newStudent("a")}},
			wantActions: []string{"add-finalizer a: before the row is written", "create a: new-student"},
		},
		"with the sweep off an orphan row stays": {
			in:          PlanInput{Rows: []registry.Record{recordOf(owner, newStudent("x"))}, PlanPolicy: PlanPolicy{NoSweep: true}},
			wantActions: []string{"refuse x: the sweep is off (--sweep-interval=0): the row stays"},
		},
		"the sweep's guard refuses more orphans than its bound": {
			in: PlanInput{Students: []*studentv1.Student{newStudent("a", withFinalizer)},
				Rows:       []registry.Record{recordOf(owner, newStudent("a")), recordOf(owner, newStudent("x")), recordOf(owner, newStudent("y"))},
				PlanPolicy: PlanPolicy{SweepMaxDeletions: 100, SweepMaxDeletionPercent: 50}},
			wantActions: []string{
				"refuse x: the sweep's guard: 2 owned rows without a Student, more than it lets go at once (1)",
				"refuse y: the sweep's guard: 2 owned rows without a Student, more than it lets go at once (1)",
			},
			wantRefused: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.in.Owner = owner
			tc.in.SweepMaxDeletions = max(tc.in.SweepMaxDeletions, 100)
			tc.in.SweepMaxDeletionPercent = max(tc.in.SweepMaxDeletionPercent, 50)
			plan := ComputePlan(tc.in)
			var got []string
			for _, a := range plan.Actions {
				got = append(got, fmt.Sprintf("%s %s: %s", a.Action, a.Name, a.Cause))
			}
			if diff := cmp.Diff(tc.wantActions, got); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
			if plan.SweepRefused != tc.wantRefused {
				t.Errorf("SweepRefused %v, want %v", plan.SweepRefused, tc.wantRefused)
			}
			if slices.ContainsFunc(plan.Actions, func(a PlannedAction) bool { return a.Action == PlanRefuse }) && plan.Changes() == len(plan.Actions) {
				t.Error("Changes counts refusals")
			}
		})
	}
}

// historyLength is the id of the registry's last history row.
func (f *fixture) historyLength() int64 {
	f.t.Helper()
	var id int64
	if err := f.rawDB().QueryRowContext(f.ctx, `SELECT coalesce(MAX(id), 0) FROM student_history`).Scan(&id); err != nil {
		f.t.Fatal(err)
	}
	return id
}

// historySince lists the history rows after id as "uid action cause", by uid: the
// row writes, without the copies of a row kept just before one (before-managed,
// before-taken-back), which write no row.
func (f *fixture) historySince(id int64) []string {
	f.t.Helper()
	rows, err := f.rawDB().QueryContext(f.ctx, `SELECT uid, action, cause FROM student_history WHERE id > $1
		AND cause NOT IN ($2, $3) ORDER BY uid, id`, id, registry.CauseBeforeManaged, registry.CauseBeforeTakenBack)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var uid, action, cause string
		if err := rows.Scan(&uid, &action, &cause); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, uid+" "+action+" "+cause)
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// TestPlanWithSelector: with a label selector, the rows of Students outside it (the API
// server has them, the scope does not) are neither orphans nor part of the rows the
// sweep's bound is a share of, in the plan as in the sweep; a row whose Student is gone
// is let go by both, and a plan refuses when the bound would.
func TestPlanWithSelector(t *testing.T) {
	blue := func(s *studentv1.Student) { s.Labels = map[string]string{"team": "blue"} }
	tests := map[string]struct {
		gone         []string
		wantActions  []string
		wantRefused  bool
		wantRows     int
		wantOrphans  int
		wantLeftRows int // after the sweep
	}{
		"one gone": {gone: []string{"gone"}, wantActions: []string{"release gone"}, wantRows: 2, wantOrphans: 1, wantLeftRows: 4},
		"two gone, bound one": {gone: []string{"gone", "gone-too"}, wantActions: []string{"refuse gone", "refuse gone-too"},
			wantRefused: true, wantRows: 3, wantOrphans: 2, wantLeftRows: 5},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			// In scope: a. Out of it, there: red, plain (not cached, as the API server
			// sends only blue ones). Gone: tc.gone.
			f := newFixture(t, newStudent("a", blue, withFinalizer, synced(start)))
			for _, s := range []*studentv1.Student{newStudent("red"), newStudent("plain")} {
				if _, err := f.client.BolingcavalryV1().Students(s.Namespace).Create(f.ctx, s, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			rows := []registry.Record{recordOf(owner, newStudent("a")), recordOf(owner, newStudent("red")), recordOf(owner, newStudent("plain"))}
			for _, name := range tc.gone {
				rows = append(rows, recordOf(owner, newStudent(name)))
			}
			f.put(rows...)
			scope, err := ParseScope("", "team=blue")
			if err != nil {
				t.Fatal(err)
			}
			f.ctrl.cfg.Scope = scope
			f.ctrl.cfg.SweepMaxDeletions, f.ctrl.cfg.SweepInterval = 100, time.Minute
			plan, err := f.ctrl.Plan(f.ctx)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, a := range plan.Actions {
				got = append(got, a.Action+" "+a.Name)
			}
			if diff := cmp.Diff(tc.wantActions, got); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
			if plan.Rows != tc.wantRows || plan.Orphans != tc.wantOrphans || plan.SweepRefused != tc.wantRefused {
				t.Errorf("plan: %d rows, %d orphans, refused %v; want %d, %d, %v", plan.Rows, plan.Orphans, plan.SweepRefused,
					tc.wantRows, tc.wantOrphans, tc.wantRefused)
			}
			result, err := f.ctrl.Sweep(f.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if result.Rows != plan.Rows || result.Orphans != plan.Orphans || result.Refused != plan.SweepRefused {
				t.Errorf("the sweep: %+v; the plan said %d rows, %d orphans, refused %v", result, plan.Rows, plan.Orphans, plan.SweepRefused)
			}
			if left := len(f.rows()); left != tc.wantLeftRows {
				t.Errorf("rows after the sweep: %d, want %d", left, tc.wantLeftRows)
			}
		})
	}
}

// TestPlanUndoBound: the plan counts the rows it would undo across Students, as the
// controller does: with a bound of one, of two rows ahead of their Students one is
// rewound and the other refused.
func TestPlanUndoBound(t *testing.T) {
	in := PlanInput{PlanPolicy: PlanPolicy{Owner: owner, MaxUndo: 1, SweepMaxDeletions: 100, SweepMaxDeletionPercent: 50}}
	for _, name := range []string{"a", "b"} {
		s := newStudent(name, withFinalizer, synced(start))
		r := recordOf(owner, s)
		r.Generation, r.School = 4, "school D"
		in.Students, in.Rows = append(in.Students, s), append(in.Rows, r)
	}
	var got []string
	for _, a := range ComputePlan(in).Actions {
		got = append(got, fmt.Sprintf("%s %s: %s", a.Action, a.Name, a.Cause))
	}
	want := []string{
		"update a: " + registry.CauseRegistryAhead,
		"refuse b: row uid-b is ahead of its Student and is past the bound of rows undone",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("plan (-want +got):\n%s", diff)
	}
}

// TestPlanRowNotBound: a Student whose row-uid annotation names a row bound to another
// Student (a copied annotation) is planned as the sync treats it: refused, with nothing
// written, no finalizer added.
func TestPlanRowNotBound(t *testing.T) {
	row := recordOf(owner, newStudent("a"))
	row.UID, row.StudentUID = "ext-1", "uid-a"
	in := PlanInput{PlanPolicy: PlanPolicy{Owner: owner, SweepMaxDeletions: 100, SweepMaxDeletionPercent: 50}, Rows: []registry.Record{row},
		Students: []*studentv1.Student{newStudent("a", withFinalizer, synced(start), namingRow("ext-1")), newStudent("copy", namingRow("ext-1"))}}
	var got []string
	for _, a := range ComputePlan(in).Actions {
		got = append(got, a.Action+" "+a.Name)
	}
	if diff := cmp.Diff([]string{"refuse copy"}, got); diff != "" {
		t.Errorf("plan (-want +got):\n%s", diff)
	}
}
