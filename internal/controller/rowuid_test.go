package controller

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
		DeletionPolicy: registry.PolicyDelete}); err != nil {
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
