package controller

import (
	"cmp"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/student-controller/student-controller/internal/decide"
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// The actions of an adoption plan (student-controller registry adopt): make an
// observed Student of a row and bind the row to it (adopt), finish one that a run cut
// short left paused (finish), bind a row again to the Student that names it (rebind),
// or leave the row and say why (refuse).
const (
	PlanAdopt  = "adopt"
	PlanFinish = "finish"
	PlanRebind = "rebind"
)

// AnnotationAdoptedFrom names, on a Student that adopt made, the uid its row had
// before adopt bound it. While adopt works the Student is also paused: the
// controller leaves it until its row is bound.
const AnnotationAdoptedFrom = "bolingcavalry.k8s.io/adopted-from"

// ClusterStudent is what an adoption plan needs of a Student of the cluster.
type ClusterStudent struct {
	UID string
	// RowUID is the uid of the Student's row: its row-uid annotation, or its own uid
	// (RowUID).
	RowUID string
	// AdoptedFrom is the Student's AnnotationAdoptedFrom, and Paused whether it is
	// paused: both, and adopt's run was cut short before the Student was let go.
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
	// Namespaces are the namespaces that exist; CreateNamespaces says adopt makes the
	// others.
	Namespaces       map[string]bool
	CreateNamespaces bool
	// Max bounds the rows one run adopts: past it, it adopts none (as the sweep's
	// guard lets none go).
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

// PlanAdoption says what adopt would do with each row: a pure function of its input,
// as ComputePlan is of a plan's.
func PlanAdoption(in AdoptInput) AdoptionPlan {
	plan := AdoptionPlan{Rows: len(in.Rows), Bound: in.Max}
	// Two rows or more that name one Student (one deleted with Orphan, made again and
	// deleted again): which is the Student is the operator's call.
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
	slices.SortStableFunc(plan.Actions, func(a, b PlannedAction) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
	return plan
}

// adoption is the decision for one row: "" when its Student is there (nothing to do),
// or an action and why. A row's Student is the one of the namespace and name the row
// records, whose row it is: a row's key is unique in its registry alone (another
// system's keys), not in the cluster.
func adoption(row registry.Record, in AdoptInput) (string, string) {
	key := row.Namespace + "/" + row.Name
	if s, ok := in.Students[key]; ok && s.RowUID == row.UID && (row.StudentUID == s.UID || row.StudentUID == "" && row.UID == s.UID) {
		if s.AdoptedFrom != "" && s.Paused {
			return PlanFinish, "adopted by a run that was cut short: let its Student go"
		}
		return "", ""
	}
	if s, ok := in.Students[key]; ok && s.RowUID == row.UID && s.UID != row.UID && s.AdoptedFrom != row.UID && (row.Owner == "" || row.Owner == in.Owner) {
		// The Student of this name names the row, which is bound to a Student gone
		// (made again, or its cluster rebuilt) or to none.
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

// AdoptedSpec is the spec of the Student that adopt makes of row: its display name and
// school, its deletion policy (Orphan when it records none: what keeps the row), and
// observed.
func AdoptedSpec(row registry.Record) studentv1.StudentSpec {
	policy := studentv1.DeletionPolicy(row.DeletionPolicy)
	if policy == "" {
		policy = studentv1.DeletionPolicyOrphan
	}
	return studentv1.StudentSpec{Name: row.StudentName, School: row.School, DeletionPolicy: policy, Management: studentv1.ManagementObserve}
}
