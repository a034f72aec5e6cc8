package controller

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/student-controller/student-controller/internal/decide"
	"github.com/student-controller/student-controller/internal/registry"
)

func TestPlanAdoption(t *testing.T) {
	row := func(uid, ns, name, owner string, opts ...func(*registry.Record)) registry.Record {
		r := registry.Record{UID: uid, Namespace: ns, Name: name, StudentName: "张三", School: "深圳中学", Owner: owner}
		for _, o := range opts {
			o(&r)
		}
		return r
	}
	released := func(r *registry.Record) { r.ReleasedAt = start }
	in := AdoptInput{
		Rows: []registry.Record{
			row("r1", "school", "released", "", released),
			row("r2", "school", "inserted", ""),
			row("r3", "school", "mine", owner),
			row("r4", "school", "theirs", "another"),
			row("r5", "school", "live", owner), // its Student is here
			row("r6", "school", "taken", ""),   // a Student of another uid holds the name
			row("r7", "school", "resumed", ""), // a cut-short run made its Student
			row("r8", "school", "bad", "", func(r *registry.Record) { r.School = " " }),
			row("r9", "gone", "nowhere", ""),            // no namespace gone
			row("r10", "school", "Not_A_Name", ""),      // no Kubernetes name
			row("u11", "school", "finished", owner),     // bound, its Student still paused
			row("r12", "school", "twice", "", released), // two rows name one Student
			row("r13", "school", "twice", "", released),
			// adopted: its key kept, bound to its Student's uid, which names it
			row("r14", "school", "kept-key", owner, func(r *registry.Record) { r.StudentUID = "u14" }),
			// bound to a Student gone, whose name a new one holds that names the row
			row("r15", "school", "made-again", owner, func(r *registry.Record) { r.StudentUID = "u-old" }),
			// another owner's: never bound again
			row("r16", "school", "theirs-again", "another", func(r *registry.Record) { r.StudentUID = "u-old" }),
		},
	}
	in.AdoptScope = decide.AdoptScope{
		Owner: owner,
		Students: map[string]decide.ClusterStudent{
			"school/live":         {UID: "r5", RowUID: "r5"},
			"school/taken":        {UID: "u-taken", RowUID: "u-taken"},
			"school/resumed":      {UID: "u-resumed", RowUID: "r7", AdoptedFrom: "r7", Paused: true}, // r7 not bound yet
			"school/finished":     {UID: "u11", RowUID: "u11", AdoptedFrom: "r11", Paused: true},
			"school/kept-key":     {UID: "u14", RowUID: "r14"},
			"school/made-again":   {UID: "u-new", RowUID: "r15"},
			"school/theirs-again": {UID: "u-new2", RowUID: "r16"},
		},
		Namespaces: map[string]bool{"school": true},
		Max:        10,
	}
	got := PlanAdoption(in)
	want := map[string]string{
		"r1": PlanAdopt, "r2": PlanAdopt, "r3": PlanAdopt, "r4": PlanRefuse, "r6": PlanRefuse, "r7": PlanAdopt,
		"r8": PlanRefuse, "r9": PlanRefuse, "r10": PlanRefuse, "u11": PlanFinish, "r12": PlanRefuse, "r13": PlanRefuse,
		"r15": PlanRebind, "r16": PlanRefuse,
	}
	actions := map[string]string{}
	for _, a := range got.Actions {
		actions[a.UID] = a.Action
	}
	if diff := cmp.Diff(want, actions); diff != "" {
		t.Errorf("actions (-want +got):\n%s\n%+v", diff, got.Actions)
	}
	if got.WithStudent != 2 || got.Rows != len(in.Rows) || got.Changes() != 6 {
		t.Errorf("plan: %d with their Student, %d rows, %d changes; want 2, %d, 6", got.WithStudent, got.Rows, got.Changes(), len(in.Rows))
	}

	in.CreateNamespaces = true
	if a := PlanAdoption(in).Actions; a[0].UID != "r9" || a[0].Action != PlanAdopt {
		t.Errorf("with --create-namespaces, the row of a missing namespace: %+v, want adopt", a[0])
	}
	in.Max = 3
	bounded := PlanAdoption(in)
	if !bounded.Refused || bounded.Changes() != 2 { // finish and rebind are not adopting a row
		t.Errorf("past the bound: refused %v, %d changes; want refused, only the finish and the rebind", bounded.Refused, bounded.Changes())
	}
}
