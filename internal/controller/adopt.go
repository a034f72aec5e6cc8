package controller

import (
	"cmp"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/student-controller/student-controller/internal/decide"
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
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

// ClusterStudent is what an adoption plan needs of a Student of the cluster.
type ClusterStudent struct {
	UID string
	// RowUID is its row's uid: its row-uid annotation, or its own uid (RowUID).
	RowUID string
	// AdoptedFrom is its AnnotationAdoptedFrom; with Paused too, adopt was cut short.
	AdoptedFrom string
	Paused      bool
}

// AdoptInput is what an adoption plan compares.
type AdoptInput struct {
	Owner string
	// Rows are the registry's readable rows in scope, of any owner.
	Rows []registry.Record
	// Students are the cluster's Students, by namespace/name.
	Students map[string]ClusterStudent
	// Namespaces are those that exist; with CreateNamespaces, adopt makes the others.
	Namespaces       map[string]bool
	CreateNamespaces bool
	// Max bounds the rows one run adopts: past it, it adopts none (like the sweep's guard).
	Max int
}

// AdoptionPlan is what adopt would do.
type AdoptionPlan struct {
	// Actions: adopt, finish and refuse, ordered by namespace, name and UID.
	Actions []PlannedAction `json:"actions"`
	// Rows are the rows compared; WithStudent those whose Student is there already.
	Rows        int `json:"rows"`
	WithStudent int `json:"withStudent"`
	// Bound is Max; Refused says there were more rows to adopt than it, and none is.
	Bound   int  `json:"bound"`
	Refused bool `json:"refused"`
}

// Changes counts the Students adopt would make or finish.
func (p AdoptionPlan) Changes() int { return changes(p.Actions) }

// PlanAdoption says what adopt would do with each row. It is a pure function.
func PlanAdoption(in AdoptInput) AdoptionPlan {
	plan := AdoptionPlan{Rows: len(in.Rows), Bound: in.Max}
	// Two or more rows naming one Student (deleted with Orphan, made and deleted again):
	// which one is the Student is the operator's call.
	type decision struct{ action, cause string }
	decisions := make([]decision, len(in.Rows))
	names := map[string]int{}
	for i, row := range in.Rows {
		decisions[i].action, decisions[i].cause = adoption(row, in)
		if decisions[i].action == PlanAdopt {
			names[row.Namespace+"/"+row.Name]++
		}
	}
	for i, row := range in.Rows {
		action, cause := decisions[i].action, decisions[i].cause
		if n := names[row.Namespace+"/"+row.Name]; action == PlanAdopt && n > 1 {
			action, cause = PlanRefuse, fmt.Sprintf("%d rows name this Student: adopt one (--school, or release or delete the others by hand)", n)
		}
		switch action {
		case "":
			plan.WithStudent++
			continue
		case PlanAdopt:
			cause = "released"
			switch {
			case row.Management == registry.ManagementObserve:
				cause = fmt.Sprintf("owned by %q and observed, whose Student is gone", row.Owner)
			case row.Owner == in.Owner:
				cause = fmt.Sprintf("owned by %q, whose Student is gone", row.Owner)
			case row.ReleasedAt.IsZero():
				cause = "no owner: written by another system"
			}
		}
		plan.Actions = append(plan.Actions, PlannedAction{Action: action, Namespace: row.Namespace, Name: row.Name, UID: row.UID, Cause: cause})
	}
	adopt := 0
	for _, a := range plan.Actions {
		if a.Action == PlanAdopt {
			adopt++
		}
	}
	if adopt > in.Max {
		plan.Refused = true
		for i, a := range plan.Actions {
			if a.Action == PlanAdopt {
				plan.Actions[i].Action = PlanRefuse
				plan.Actions[i].Cause = fmt.Sprintf("the bound: %d rows to adopt, more than one run adopts (--max-adoptions %d)", adopt, in.Max)
			}
		}
	}
	sortActions(plan.Actions)
	return plan
}

// adoption decides for one row: "" when its Student is there, else an action and why.
// Its Student must name the row too: row keys are unique per registry, not per cluster.
func adoption(row registry.Record, in AdoptInput) (string, string) {
	key := row.Namespace + "/" + row.Name
	if s, ok := in.Students[key]; ok && s.RowUID == row.UID && (row.StudentUID == s.UID || row.StudentUID == "" && row.UID == s.UID) {
		if s.AdoptedFrom != "" && s.Paused {
			return PlanFinish, "adopted by a run that was cut short: let its Student go"
		}
		return "", ""
	}
	if s, ok := in.Students[key]; ok && s.RowUID == row.UID && s.UID != row.UID && s.AdoptedFrom != row.UID && (row.Owner == "" || row.Owner == in.Owner) {
		// This name's Student names the row, bound to a Student gone (made again) or none.
		if row.Owner == "" {
			return PlanRebind, "no owner and no binding (released, written again whole by its system, or put back from an older backup): " +
				"bound to the Student that names it"
		}
		return PlanRebind, fmt.Sprintf("bound to Student %s, which is gone: bound to the Student that names it", cmp.Or(row.StudentUID, row.UID))
	}
	if _, adoptable, why := decide.WithoutStudent(row, in.Owner); !adoptable {
		return PlanRefuse, why
	}
	if s, ok := in.Students[key]; ok {
		if s.AdoptedFrom == row.UID {
			return PlanAdopt, ""
		}
		return PlanRefuse, fmt.Sprintf("a Student %s of another uid (%s) is there", key, s.UID)
	}
	if errs := validation.IsDNS1123Label(row.Namespace); len(errs) > 0 {
		return PlanRefuse, fmt.Sprintf("cannot be a Student: namespace %q: %s", row.Namespace, errs[0])
	}
	if errs := validation.IsDNS1123Subdomain(row.Name); len(errs) > 0 {
		return PlanRefuse, fmt.Sprintf("cannot be a Student: name %q: %s", row.Name, errs[0])
	}
	if problem := AdoptedSpec(row).Validate(); problem != "" {
		return PlanRefuse, "cannot be a Student: " + problem
	}
	if !in.Namespaces[row.Namespace] && !in.CreateNamespaces {
		return PlanRefuse, fmt.Sprintf("namespace %s does not exist (--create-namespaces makes it)", row.Namespace)
	}
	return PlanAdopt, ""
}

// AdoptedSpec is the spec of the Student adopt makes of row: observed, with its name,
// school and deletion policy (Orphan, which keeps the row, when none is recorded).
func AdoptedSpec(row registry.Record) studentv1.StudentSpec {
	policy := studentv1.DeletionPolicy(row.DeletionPolicy)
	if policy == "" {
		policy = studentv1.DeletionPolicyOrphan
	}
	return studentv1.StudentSpec{Name: row.StudentName, School: row.School, DeletionPolicy: policy, Management: studentv1.ManagementObserve}
}
