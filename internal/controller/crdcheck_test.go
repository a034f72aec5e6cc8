package controller

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	sigsyaml "sigs.k8s.io/yaml"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

func readCRD(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(path) // #nosec G304 -- the test's own files
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := sigsyaml.Unmarshal(b, &obj); err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: obj}
}

// TestMissingFields: this version's CRD has every field the controller relies on;
// 0.2.0's lacks spec.management, which the check names.
func TestMissingFields(t *testing.T) {
	if missing := MissingFields(readCRD(t, "../../config/crd/bases/bolingcavalry.k8s.io_students.yaml")); len(missing) != 0 {
		t.Errorf("this version's CRD lacks %v", missing)
	}
	if missing := MissingFields(readCRD(t, "testdata/crd-0.2.0.yaml")); !slices.Equal(missing, []string{"spec.management"}) {
		t.Errorf("0.2.0's CRD lacks %v, want [spec.management]", missing)
	}
	if missing := MissingFields(&unstructured.Unstructured{Object: map[string]any{}}); len(missing) != len(RequiredFields) {
		t.Errorf("no schema at all: %d missing, want all %d", len(missing), len(RequiredFields))
	}
}

// TestCRDWatch: an older CRD applied while the controller runs stops its writes for
// live Students and says why; this version's CRD applied again syncs every Student.
func TestCRDWatch(t *testing.T) {
	// As the API server serves it: the CRD defaults spec.management.
	f := newFixture(t, newStudent("a", func(s *studentv1.Student) { s.Spec.Management = studentv1.ManagementManage }),
		newStudent("pruned"), newStudent("gone", withFinalizer))
	w := &crdWatch{}
	f.ctrl.crd = w
	synced := 0
	w.current = func() { synced++ }
	w.seen(readCRD(t, "testdata/crd-0.2.0.yaml"))
	var old *CRDTooOldError
	if err := f.ctrl.CRDOlder(); !errors.As(err, &old) || !slices.Equal(old.Missing, []string{"spec.management"}) {
		t.Fatalf("CRDOlder under 0.2.0's CRD: %v, want spec.management missing", err)
	}
	if err := f.ctrl.sync(f.ctx, "school/a"); err == nil {
		t.Error("sync under an older CRD: no error")
	}
	if got := f.writes(); len(got) != 0 {
		t.Errorf("API writes under an older CRD: %v, want none", got)
	}
	if rows := f.rows(); len(rows) != 0 {
		t.Errorf("rows under an older CRD: %v, want none", rows)
	}
	// The older CRD then deleted: a Delete Student's finalizer still asks, and
	// releases its row.
	f.ctrl.cfg.CRDDeleting = func(context.Context) (bool, error) { return true, nil }
	f.put(recordOf(owner, f.get("school", "gone")))
	gone := f.get("school", "gone")
	deleting(gone)
	if _, err := f.client.BolingcavalryV1().Students("school").Update(f.ctx, gone, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.observe("school", "gone")
	if err := f.ctrl.sync(f.ctx, "school/gone"); err != nil {
		t.Fatal(err)
	}
	if row, ok := f.rows()["uid-gone"]; !ok || row.Owner != "" {
		t.Errorf("the row of a Delete Student deleted with the older CRD being deleted: %+v (there: %v); want it kept, released", row, ok)
	}
	f.ctrl.cfg.CRDDeleting = nil

	w.seen(readCRD(t, "../../config/crd/bases/bolingcavalry.k8s.io_students.yaml"))
	if err := f.ctrl.CRDOlder(); err != nil || synced != 1 {
		t.Fatalf("this version's CRD applied again: CRDOlder %v, %d syncs of all; want nil, 1", err, synced)
	}
	w.seen(readCRD(t, "../../config/crd/bases/bolingcavalry.k8s.io_students.yaml"))
	if synced != 1 {
		t.Errorf("an update of a current CRD synced all again")
	}
	if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.rows()["uid-a"]; !ok {
		t.Error("no row once the CRD is current")
	}
	// A Student the cache still holds as the older CRD served it: not written.
	if err := f.ctrl.sync(f.ctx, "school/pruned"); err == nil {
		t.Error("sync of a Student without spec.management: no error")
	}
	if _, ok := f.rows()["uid-pruned"]; ok {
		t.Error("a Student without spec.management (read through an older CRD) got a row")
	}
}
