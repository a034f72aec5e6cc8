package decide

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// adoptWorld is one row and the Student of its namespace and name, if any, as adopt
// sees them, with the writes registry adopt makes applied to them.
type adoptWorld struct {
	row     registry.Record
	student *ClusterStudent
	nsThere bool
}

// step applies one adopt step as the command does; cut stops it after that many writes.
func (w *adoptWorld) step(d Adoption, cut int) {
	writes := 0
	write := func(f func()) {
		if cut < 0 || writes < cut {
			f()
		}
		writes++
	}
	bind := func(uid, management string) {
		w.row.StudentUID = uid
		if uid == w.row.UID {
			w.row.StudentUID = ""
		}
		w.row.Owner, w.row.ReleasedAt, w.row.ReleasedBy, w.row.Management = me, time.Time{}, "", management
	}
	unpause := func() { w.student.Paused, w.student.AdoptedFrom = false, "" }
	switch d.Step {
	case AdoptFinish:
		write(unpause)
	case AdoptRebind:
		write(func() { bind(w.student.UID, "") })
	case AdoptMake, AdoptResume:
		if d.Observe {
			write(func() { w.row.Management = registry.ManagementObserve })
		}
		if d.CreateNamespace {
			write(func() { w.nsThere = true })
		}
		if d.Step == AdoptMake {
			write(func() {
				w.student = &ClusterStudent{UID: "made", RowUID: w.row.UID, AdoptedFrom: w.row.UID, Paused: true}
			})
		}
		write(func() { bind(w.student.UID, registry.ManagementObserve) })
		write(unpause)
	}
}

func (w *adoptWorld) decide(create bool) Adoption {
	in := AdoptScope{Owner: me, Students: map[string]ClusterStudent{}, Namespaces: map[string]bool{"ns": w.nsThere}, CreateNamespaces: create, Max: 1}
	if w.student != nil {
		in.Students["ns/"+w.row.Name] = *w.student
	}
	d, _ := Adopt([]registry.Record{w.row}, in)
	return d[0]
}

// TestAdoptModel walks adopt's decision over every row (owner, release, management,
// binding, a name that can be a Student or not) and every Student of its name, and
// checks that adopt writes no row of another owner, binds a row only to the Student
// that names it, and that a run cut short after any write is finished by the next.
func TestAdoptModel(t *testing.T) {
	cases := 0
	for _, owner := range []string{"", me, other} {
		for _, released := range []bool{false, true} {
			for _, management := range []string{"", registry.ManagementObserve} {
				for _, studentUID := range []string{"", "s-1", "gone"} {
					for _, name := range []string{"alice", "Not_A_Name"} {
						for _, student := range adoptStudents() {
							for _, ns := range []bool{false, true} {
								for _, create := range []bool{false, true} {
									row := registry.Record{UID: "row-1", StudentUID: studentUID, Namespace: "ns", Name: name,
										StudentName: "张三", School: "深圳中学", Owner: owner, Management: management}
									if released {
										row.ReleasedAt, row.ReleasedBy = time.Unix(1, 0), me
									}
									for cut := -1; cut < 5; cut++ {
										cases++
										checkAdopt(t, adoptWorld{row: row, student: student, nsThere: ns}, create, cut)
									}
								}
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d cases", cases)
}

// adoptStudents are the Students a row's name may hold: none, its own, one that names
// the row, another, and ones a run cut short left paused.
func adoptStudents() []*ClusterStudent {
	out := []*ClusterStudent{nil}
	for _, uid := range []string{"row-1", "s-1", "s-2"} {
		for _, rowUID := range []string{"row-1", uid} {
			for _, from := range []string{"", "row-1", "elsewhere"} {
				for _, paused := range []bool{false, true} {
					out = append(out, &ClusterStudent{UID: uid, RowUID: rowUID, AdoptedFrom: from, Paused: paused})
				}
			}
		}
	}
	return out
}

func checkAdopt(t *testing.T, w adoptWorld, create bool, cut int) {
	t.Helper()
	start := fmt.Sprintf("row %+v, Student %+v, namespace there %v, create %v, cut after %d writes", w.row, w.student, w.nsThere, create, cut)
	d := w.decide(create)
	if d.Step != AdoptNothing && d.Cause == "" {
		t.Errorf("%s: step %d without a cause", start, d.Step)
	}
	if d.Step != AdoptNothing && d.Step != AdoptRefuse {
		if d.Step == AdoptRebind && w.student.RowUID != w.row.UID {
			t.Errorf("%s: bound again to a Student that does not name the row", start)
		}
		if d.Step == AdoptMake && w.student != nil {
			t.Errorf("%s: makes a Student where one is", start)
		}
	}
	before := w.row
	w.step(d, cut)
	for range 3 {
		if d = w.decide(create); d.Step == AdoptNothing || d.Step == AdoptRefuse {
			break
		}
		w.step(d, -1)
	}
	if before.Owner == other && w.row != before {
		t.Errorf("%s: wrote another owner's row: %+v", start, w.row)
	}
	if d.Step == AdoptRefuse && w.row != before {
		t.Errorf("%s: refused after it wrote the row: %+v", start, w.row)
	}
	if d.Step == AdoptNothing && w.student != nil && (w.student.RowUID != w.row.UID || w.student.Paused && w.student.AdoptedFrom != "") {
		t.Errorf("%s: settled with its Student %+v not naming the row or still paused", start, w.student)
	}
	if d.Step != AdoptNothing && d.Step != AdoptRefuse {
		t.Errorf("%s: not settled after three runs: step %d", start, d.Step)
	}
	_, adoptable, _ := WithoutStudent(w.row, me)
	if d.Step == AdoptRefuse && adoptable && w.student != nil && w.student.AdoptedFrom == w.row.UID && w.student.RowUID != w.row.UID {
		// A Student adopt made of the row, which does not name it: the cause gives the
		// one command that lets the next run finish it.
		remedy := studentv1.AnnotationRowUID + "=" + w.row.UID
		if !strings.Contains(d.Cause, remedy) {
			t.Errorf("%s: refused without the remedy (annotate %s): %s", start, remedy, d.Cause)
		}
		w.student.RowUID = w.row.UID
		for range 3 {
			if d = w.decide(create); d.Step == AdoptNothing || d.Step == AdoptRefuse {
				break
			}
			w.step(d, -1)
		}
		if d.Step != AdoptNothing || w.student.Paused {
			t.Errorf("%s: not settled after the remedy: step %d (%s), Student %+v", start, d.Step, d.Cause, w.student)
		}
	}
}

func TestAdoptedSpec(t *testing.T) {
	r := registry.Record{StudentName: "张三", School: "深圳中学", ReleasedAt: time.Now()}
	if got := AdoptedSpec(r); got.DeletionPolicy != studentv1.DeletionPolicyOrphan || got.Management != studentv1.ManagementObserve {
		t.Errorf("spec of a row with no policy: %+v, want Orphan, Observe", got)
	}
	r.DeletionPolicy = registry.PolicyDelete
	if got := AdoptedSpec(r); got.DeletionPolicy != studentv1.DeletionPolicyDelete {
		t.Errorf("spec of a Delete row: %+v, want Delete", got)
	}
}
