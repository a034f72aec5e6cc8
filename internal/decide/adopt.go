package decide

import (
	"cmp"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// AdoptStep is what registry adopt does with one row.
type AdoptStep int

const (
	// AdoptNothing: the row's Student is here and names it.
	AdoptNothing AdoptStep = iota
	// AdoptMake makes a paused, observed Student of the row and binds the row to it.
	AdoptMake
	// AdoptResume binds the row to the paused Student a run cut short made of it.
	AdoptResume
	// AdoptFinish lets go of a Student a run cut short left paused, its row bound.
	AdoptFinish
	// AdoptRebind binds the row again to the Student that names it.
	AdoptRebind
	AdoptRefuse
)

// Adoption is adopt's decision for one row.
type Adoption struct {
	Step  AdoptStep
	Cause string
	// Observe: mark the owner's managed row observed first, so the sweep leaves it.
	Observe bool
	// CreateNamespace: the row's namespace does not exist yet.
	CreateNamespace bool
}

// ClusterStudent is what adopt reads of a Student of the cluster.
type ClusterStudent struct {
	UID string
	// RowUID is its row's uid: its row-uid annotation, or its own uid.
	RowUID string
	// AdoptedFrom is its adopted-from annotation; with Paused too, adopt was cut short.
	AdoptedFrom string
	Paused      bool
}

// AdoptScope is what adopt compares the rows with.
type AdoptScope struct {
	Owner string
	// Students are the cluster's Students, by namespace/name.
	Students map[string]ClusterStudent
	// Namespaces are those that exist; with CreateNamespaces, adopt makes the others.
	Namespaces       map[string]bool
	CreateNamespaces bool
	// Max bounds the rows one run adopts: past it, it adopts none (like the sweep's bound).
	Max int
}

// Adopt decides for each row; pastBound says more rows were to be adopted than Max.
func Adopt(rows []registry.Record, in AdoptScope) (decisions []Adoption, pastBound bool) {
	decisions = make([]Adoption, len(rows))
	names := map[string]int{}
	adopting := 0
	for i, row := range rows {
		decisions[i] = adoptRow(row, in)
		if decisions[i].Step == AdoptMake || decisions[i].Step == AdoptResume {
			names[row.Namespace+"/"+row.Name]++
			adopting++
		}
	}
	for i, row := range rows {
		d := &decisions[i]
		if d.Step != AdoptMake && d.Step != AdoptResume {
			continue
		}
		if n := names[row.Namespace+"/"+row.Name]; n > 1 {
			// Which of them is the Student (deleted with Orphan, made again) is the operator's call.
			*d = Adoption{Step: AdoptRefuse, Cause: fmt.Sprintf("%d rows name this Student: adopt one (--school, or release or delete the others by hand)", n)}
			adopting--
		}
	}
	if adopting <= in.Max {
		return decisions, false
	}
	for i := range decisions {
		if d := &decisions[i]; d.Step == AdoptMake || d.Step == AdoptResume {
			*d = Adoption{Step: AdoptRefuse, Cause: fmt.Sprintf("the bound: %d rows to adopt, more than one run adopts (--max-adoptions %d)", adopting, in.Max)}
		}
	}
	return decisions, true
}

// adoptRow decides for one row. Its Student must name it too: row keys are unique per
// registry, not per cluster.
func adoptRow(row registry.Record, in AdoptScope) Adoption {
	key := row.Namespace + "/" + row.Name
	s, here := in.Students[key]
	names := here && s.RowUID == row.UID
	switch {
	case names && (row.StudentUID == s.UID || row.StudentUID == "" && row.UID == s.UID):
		if s.AdoptedFrom != "" && s.Paused {
			return Adoption{Step: AdoptFinish, Cause: "adopted by a run that was cut short: let its Student go"}
		}
		return Adoption{}
	case names && s.UID != row.UID && s.AdoptedFrom != row.UID && (row.Owner == "" || row.Owner == in.Owner):
		// This name's Student names the row, bound to a Student gone (made again) or none.
		if row.Owner == "" {
			return Adoption{Step: AdoptRebind, Cause: "no owner and no binding (released, written again whole by its system, " +
				"or put back from an older backup): bound to the Student that names it"}
		}
		return Adoption{Step: AdoptRebind, Cause: fmt.Sprintf("bound to Student %s, which is gone: bound to the Student that names it", cmp.Or(row.StudentUID, row.UID))}
	}
	if _, adoptable, why := WithoutStudent(row, in.Owner); !adoptable {
		return Adoption{Step: AdoptRefuse, Cause: why}
	}
	if why := adoptable(row, s, here, in); why != "" {
		return Adoption{Step: AdoptRefuse, Cause: why}
	}
	d := Adoption{Step: AdoptMake, Cause: "released", Observe: row.Owner == in.Owner && row.Management != registry.ManagementObserve,
		CreateNamespace: !in.Namespaces[row.Namespace]}
	if here {
		d.Step, d.CreateNamespace = AdoptResume, false
	}
	switch {
	case row.Management == registry.ManagementObserve:
		d.Cause = fmt.Sprintf("owned by %q and observed, whose Student is gone", row.Owner)
	case row.Owner == in.Owner:
		d.Cause = fmt.Sprintf("owned by %q, whose Student is gone", row.Owner)
	case row.ReleasedAt.IsZero():
		d.Cause = "no owner: written by another system"
	}
	return d
}

// adoptable says why a row cannot be made a Student, or bound to the one adopt made.
func adoptable(row registry.Record, s ClusterStudent, here bool, in AdoptScope) string {
	switch {
	case here && s.AdoptedFrom == row.UID && s.RowUID != row.UID:
		// Made of this row by a run cut short of a version that did not annotate it.
		return fmt.Sprintf("Student %s/%s was made of this row by a run cut short, and does not name it: "+
			"annotate it %s=%s, then run adopt again", row.Namespace, row.Name, studentv1.AnnotationRowUID, row.UID)
	case here && (s.AdoptedFrom != row.UID || s.RowUID != row.UID):
		return fmt.Sprintf("a Student %s/%s of another uid (%s) is there", row.Namespace, row.Name, s.UID)
	case here:
		return ""
	}
	if errs := validation.IsDNS1123Label(row.Namespace); len(errs) > 0 {
		return fmt.Sprintf("cannot be a Student: namespace %q: %s", row.Namespace, errs[0])
	}
	if errs := validation.IsDNS1123Subdomain(row.Name); len(errs) > 0 {
		return fmt.Sprintf("cannot be a Student: name %q: %s", row.Name, errs[0])
	}
	if problem := AdoptedSpec(row).Validate(); problem != "" {
		return "cannot be a Student: " + problem
	}
	if !in.Namespaces[row.Namespace] && !in.CreateNamespaces {
		return fmt.Sprintf("namespace %s does not exist (--create-namespaces makes it)", row.Namespace)
	}
	return ""
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
