package controller

import (
	"github.com/student-controller/student-controller/internal/decide"
	"github.com/student-controller/student-controller/internal/registry"
)

// Adoption plan actions (student-controller registry adopt): adopt makes an observed
// Student of a row and binds the row to it; finish completes one a cut-short run left
// paused; rebind binds a row again to the Student that names it; refuse leaves the row.
const (
	PlanAdopt  = "adopt"
	PlanFinish = "finish"
	PlanRebind = "rebind"
)

// AnnotationAdoptedFrom holds, on a Student adopt made, its row's uid before adopt bound
// it. While adopt works, the Student is also paused, so the controller leaves it alone.
const AnnotationAdoptedFrom = "bolingcavalry.k8s.io/adopted-from"

// AdoptInput is what an adoption plan compares.
type AdoptInput struct {
	decide.AdoptScope
	// Rows are the registry's readable rows in scope, of any owner.
	Rows []registry.Record
}

// AdoptionPlan is what adopt would do.
type AdoptionPlan struct {
	// Actions: adopt, finish, rebind and refuse, ordered by namespace, name and UID.
	Actions []PlannedAction `json:"actions"`
	// Steps are the decisions behind the actions, by row uid.
	Steps map[string]decide.Adoption `json:"-"`
	// Rows are the rows compared; WithStudent those whose Student is there already.
	Rows        int `json:"rows"`
	WithStudent int `json:"withStudent"`
	// Bound is Max; Refused says there were more rows to adopt than it, and none is.
	Bound   int  `json:"bound"`
	Refused bool `json:"refused"`
}

// Changes counts the Students adopt would make or finish.
func (p AdoptionPlan) Changes() int { return changes(p.Actions) }

var adoptActions = map[decide.AdoptStep]string{
	decide.AdoptMake: PlanAdopt, decide.AdoptResume: PlanAdopt, decide.AdoptFinish: PlanFinish,
	decide.AdoptRebind: PlanRebind, decide.AdoptRefuse: PlanRefuse,
}

// PlanAdoption says what adopt would do with each row, as decide.Adopt decides.
func PlanAdoption(in AdoptInput) AdoptionPlan {
	plan := AdoptionPlan{Rows: len(in.Rows), Bound: in.Max, Steps: map[string]decide.Adoption{}}
	var decisions []decide.Adoption
	decisions, plan.Refused = decide.Adopt(in.Rows, in.AdoptScope)
	for i, row := range in.Rows {
		d := decisions[i]
		if d.Step == decide.AdoptNothing {
			plan.WithStudent++
			continue
		}
		plan.Steps[row.UID] = d
		plan.Actions = append(plan.Actions, PlannedAction{Action: adoptActions[d.Step], Namespace: row.Namespace, Name: row.Name, UID: row.UID, Cause: d.Cause})
	}
	sortActions(plan.Actions)
	return plan
}
