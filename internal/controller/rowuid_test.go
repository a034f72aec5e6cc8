package controller

import (
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/decide"
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

func namingRow(row string) studentOption {
	return func(s *studentv1.Student) {
		s.Annotations = map[string]string{studentv1.AnnotationRowUID: row}
	}
}

// TestAdoptedRowKeepsItsKey: a Student bound to a row of another system's key (as
// adopt leaves it) follows that row: the other system's writes by its key show as
// drift, the sweep keeps the row, switching to Manage writes that row (no second
// one), and deleting the Student lets go of it. A Student that names a row bound to
// another is refused and touches nothing.
func TestAdoptedRowKeepsItsKey(t *testing.T) {
	f := newFixture(t, newStudent("a", withFinalizer, observing, namingRow("ext-1")),
		newStudent("copy", withFinalizer, namingRow("ext-1")))
	db := f.rawDB()
	exec := func(query string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(f.ctx, query, args...); err != nil {
			t.Fatal(err)
		}
	}
	// Another system's row, adopted for Student a.
	exec(`INSERT INTO students (uid, namespace, name, student_name, school) VALUES ('ext-1', 'school', 'a', '张三', '深圳中学')`)
	if err := f.registry.Adopt(f.ctx, "ext-1", registry.Record{UID: "uid-a", Namespace: "school", Name: "a", Owner: owner, Generation: 1,
		DeletionPolicy: registry.PolicyDelete, Management: registry.ManagementObserve}, registry.CauseAdopted); err != nil {
		t.Fatal(err)
	}
	sync := func(name string) error {
		t.Helper()
		f.observe("school", name)
		return f.ctrl.sync(f.ctx, "school/"+name)
	}
	if err := sync("a"); err != nil {
		t.Fatal(err)
	}
	if c := f.conditionOf("a", studentv1.ConditionReady); c == nil || c.Reason != studentv1.ReasonInLine {
		t.Fatalf("Ready of the adopted Student: %+v, want InLine", c)
	}
	// The other system writes its row by its own key.
	exec(`UPDATE students SET school = 'school B' WHERE uid = 'ext-1'`)
	if err := sync("a"); err != nil {
		t.Fatal(err)
	}
	if c := f.conditionOf("a", studentv1.ConditionDrifted); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Drifted after the other system's write: %+v, want True", c)
	}

	// A copy of the annotation on another Student: refused, nothing written.
	if err := sync("copy"); err == nil {
		t.Error("sync of a Student naming a row bound to another: no error")
	}
	if c := f.conditionOf("copy", studentv1.ConditionReady); c == nil || c.Reason != studentv1.ReasonRowNotBound {
		t.Errorf("Ready of the copy: %+v, want RowNotBound", c)
	}
	if row := f.rows()["ext-1"]; row.School != "school B" || row.StudentUID != "uid-a" {
		t.Errorf("the row after the copy's sync: %+v; want it as the other system left it, bound to uid-a", row)
	}

	// The sweep: the row has its Student.
	if got, err := f.ctrl.Sweep(f.ctx); err != nil || got.Orphans != 0 {
		t.Errorf("sweep: %+v, %v; want no orphan", got, err)
	}

	// Manage: the Student's spec goes into that row, and no row of its own uid appears.
	s := f.get("school", "a")
	s.Spec.Management = studentv1.ManagementManage
	s.Generation = 2
	if _, err := f.client.BolingcavalryV1().Students("school").Update(f.ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := sync("a"); err != nil {
		t.Fatal(err)
	}
	rows := f.rows()
	if row := rows["ext-1"]; row.School != "深圳中学" || row.Owner != owner || row.Management != "" || row.StudentUID != "uid-a" {
		t.Errorf("the row once managed: %+v; want the spec's school, owned, managed, still bound", row)
	}
	if _, ok := rows["uid-a"]; ok || len(rows) != 1 {
		t.Errorf("rows once managed: %v; want the one row ext-1", rows)
	}

	// The copy's deletion lets go of nothing; the Student's own deletes its row.
	for _, name := range []string{"copy", "a"} {
		// The fake API server has no finalizers: the deletion is the timestamp.
		s := f.get("school", name)
		deleting(s)
		if _, err := f.client.BolingcavalryV1().Students("school").Update(f.ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		err := sync(name)
		_, there := f.rows()["ext-1"]
		switch {
		case err != nil:
			t.Fatalf("finalize %s: %v", name, err)
		case name == "copy" && !there:
			t.Error("the copy's deletion deleted the row")
		case name == "a" && there:
			t.Error("the bound Student's deletion (policy Delete) kept the row")
		}
	}
}

// TestLostBindingIsFoundAgain: a Student whose row lost its binding, while the row
// still records the Student's namespace and name, binds it again and keeps the one
// row: the other system wrote the row again whole (delete and insert), or the
// Student was deleted with Orphan and made again with a new uid. The history must say
// the row was this owner's: a row named by an annotation set by hand is refused.
func TestLostBindingIsFoundAgain(t *testing.T) {
	f := newFixture(t, newStudent("a", withFinalizer, observing, namingRow("ext-1")),
		newStudent("b", withFinalizer, orphan, namingRow("ext-2")))
	db := f.rawDB()
	exec := func(query string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(f.ctx, query, args...); err != nil {
			t.Fatal(err)
		}
	}
	sync := func(name string) {
		t.Helper()
		f.observe("school", name)
		if err := f.ctrl.sync(f.ctx, "school/"+name); err != nil {
			t.Fatalf("sync %s: %v", name, err)
		}
	}
	for _, r := range []struct{ row, name, uid, management string }{{"ext-1", "a", "uid-a", registry.ManagementObserve}, {"ext-2", "b", "uid-b", ""}} {
		exec(`INSERT INTO students (uid, namespace, name, student_name, school) VALUES ($1, 'school', $2, '张三', '深圳中学')`, r.row, r.name)
		if err := f.registry.Adopt(f.ctx, r.row, registry.Record{UID: r.uid, Namespace: "school", Name: r.name, Owner: owner, Generation: 1,
			DeletionPolicy: registry.PolicyOrphan, Management: r.management}, registry.CauseAdopted); err != nil {
			t.Fatal(err)
		}
		sync(r.name)
	}
	f.events()

	// The other system replaces its row whole: no owner, no binding, a new school.
	exec(`DELETE FROM students WHERE uid = 'ext-1'`)
	exec(`INSERT INTO students (uid, namespace, name, student_name, school) VALUES ('ext-1', 'school', 'a', '张三', 'school C')`)
	sync("a")
	if row := f.rows()["ext-1"]; row.Owner != owner || row.StudentUID != "uid-a" || row.Management != registry.ManagementObserve || row.School != "school C" {
		t.Errorf("the replaced row after the sync: %+v; want it bound to uid-a again, observed, as the other system wrote it", row)
	}
	if c := f.conditionOf("a", studentv1.ConditionReady); c == nil || c.Reason != studentv1.ReasonDrifted {
		t.Errorf("Ready of a: %+v, want Drifted (the school differs)", c)
	}
	if got := f.events(); !slices.ContainsFunc(got, func(e string) bool { return strings.Contains(e, decide.EventRowRebound) }) {
		t.Errorf("events: %v, want %s", got, decide.EventRowRebound)
	}

	// An annotation set by hand on a Student of another system's row's name, which
	// this owner never held: refused, the row untouched, left to registry adopt.
	exec(`INSERT INTO students (uid, namespace, name, student_name, school) VALUES ('ext-c', 'school', 'c', '张三', 'their school')`)
	handSet := newStudent("c", withFinalizer, namingRow("ext-c"))
	handSet.Spec.Management = studentv1.ManagementManage
	if _, err := f.client.BolingcavalryV1().Students("school").Create(f.ctx, handSet, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.observe("school", "c")
	if err := f.ctrl.sync(f.ctx, "school/c"); err == nil {
		t.Error("sync of a Student whose annotation names a row this owner never held: no error")
	}
	if c := f.conditionOf("c", studentv1.ConditionReady); c == nil || c.Reason != studentv1.ReasonRowNotBound || !strings.Contains(c.Message, "registry adopt") {
		t.Errorf("Ready of c: %+v, want RowNotBound naming registry adopt", c)
	}
	if row := f.rows()["ext-c"]; row.Owner != "" || row.StudentUID != "" || row.School != "their school" {
		t.Errorf("the other system's row after c's sync: %+v; want it untouched", row)
	}
	exec(`DELETE FROM students WHERE uid = 'ext-c'`)

	// b, deleted with Orphan, lets its row go; made again, with a new uid, it binds it.
	s := f.get("school", "b")
	deleting(s)
	if _, err := f.client.BolingcavalryV1().Students("school").Update(f.ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sync("b")
	if row := f.rows()["ext-2"]; row.Owner != "" || row.ReleasedAt.IsZero() {
		t.Fatalf("the row of b after its deletion: %+v, want it released", row)
	}
	if err := f.client.BolingcavalryV1().Students("school").Delete(f.ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := newStudent("b", orphan, namingRow("ext-2"))
	again.UID = "uid-b2"
	if _, err := f.client.BolingcavalryV1().Students("school").Create(f.ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sync("b")
	rows := f.rows()
	if row := rows["ext-2"]; row.Owner != owner || row.StudentUID != "uid-b2" || !row.ReleasedAt.IsZero() {
		t.Errorf("the row of b made again: %+v; want it owned and bound to uid-b2", row)
	}
	if len(rows) != 2 {
		t.Errorf("rows: %v; want ext-1 and ext-2 alone", rows)
	}
	if c := f.conditionOf("b", studentv1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Ready of b made again: %+v, want True", c)
	}
}
