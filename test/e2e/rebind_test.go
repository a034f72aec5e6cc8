package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// TestAdoptRebind: two rows another system inserted, adopted as observed Students.
// The system writes one again whole (delete and insert: no owner, no binding): the
// controller binds it again to its Student, which reports the drift, with one row. The
// other Student is deleted and made again from its manifest (a new uid): the
// controller refuses it as RowNotBound, naming registry adopt, which binds the row to
// it; the controller then reports it in line, with one row.
func TestAdoptRebind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := ctrlbin.Binary(t)
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := registrytest.SQLiteBackend().New(t)
	reg, err := registry.Open(ctx, url, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg.Close()
	for _, name := range []string{"a", "b"} {
		mustExec(t, db, `INSERT INTO students (uid, namespace, name, student_name, school) VALUES ($1, $2, $3, '学生', '深圳中学')`, "ext-"+name, ns, name)
	}
	adopt := func() string {
		t.Helper()
		out, err := exec.Command(bin, "registry", "adopt", "--kubeconfig", env.Kubeconfig, "--registry", url, "--registry-owner", owner, // #nosec G204 -- the controller built for the test
			"--registry-mark-namespace", ns, "--namespace", ns).CombinedOutput()
		if err != nil {
			t.Fatalf("registry adopt: %v\n%s", err, out)
		}
		return string(out)
	}
	adopt()
	ctl := startController(t, controllerOptions{registryURL: url, namespace: ns, sweepInterval: time.Second})
	waitAllReady(t, ns, 2, time.Minute)
	bound := func(row, uid string) bool {
		var n int
		err := db.QueryRowContext(ctx, `SELECT count(*) FROM students WHERE uid = $1 AND student_uid = $2 AND owner = $3`, row, uid, owner).Scan(&n)
		return err == nil && n == 1
	}

	// The other system writes its row again whole, with another school.
	a, err := students(ns).Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `DELETE FROM students WHERE uid = 'ext-a'`)
	mustExec(t, db, `INSERT INTO students (uid, namespace, name, student_name, school) VALUES ('ext-a', $1, 'a', '学生', 'school C')`, ns)
	eventually(t, time.Minute, "a's row bound again, a Drifted", func(ctx context.Context) (bool, error) {
		s, err := students(ns).Get(ctx, "a", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return bound("ext-a", string(a.UID)) && meta.IsStatusConditionTrue(s.Status.Conditions, studentv1.ConditionDrifted), nil
	})
	eventually(t, time.Minute, "a RowRebound Event on a", func(ctx context.Context) (bool, error) {
		events, err := kubeEvents(ctx, ns, "a")
		return containsReason(events, "RowRebound"), err
	})

	// b deleted and made again from its manifest: a new uid that names the row.
	b, err := students(ns).Get(ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := students(ns).Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "b gone", func(ctx context.Context) (bool, error) {
		_, err := students(ns).Get(ctx, "b", metav1.GetOptions{})
		return err != nil, nil
	})
	again := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Name: "b", Annotations: map[string]string{studentv1.AnnotationRowUID: "ext-b"}}, Spec: b.Spec}
	if again, err = students(ns).Create(ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "b refused as RowNotBound, naming registry adopt", func(ctx context.Context) (bool, error) {
		s, err := students(ns).Get(ctx, "b", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionReady)
		return c != nil && c.Reason == studentv1.ReasonRowNotBound && strings.Contains(c.Message, "registry adopt"), nil
	})
	ctl.stop()
	if out := adopt(); !strings.Contains(out, "rebind") {
		t.Errorf("registry adopt: want b's row bound again:\n%s", out)
	}
	if !bound("ext-b", string(again.UID)) {
		t.Errorf("b's row after adopt: not bound to the new uid %s", again.UID)
	}
	startController(t, controllerOptions{registryURL: url, namespace: ns, sweepInterval: time.Second})
	eventually(t, time.Minute, "b Ready again", func(ctx context.Context) (bool, error) {
		s, err := students(ns).Get(ctx, "b", metav1.GetOptions{})
		return err == nil && isReady(s), err
	})
	if rows := rowsOf(t, db); len(rows) != 2 {
		t.Errorf("rows: %v; want ext-a and ext-b alone", rows)
	}
}
