package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// TestAdopt: a registry of 200 rows and no Students. adopt --dry-run lists 200 and
// changes nothing; adopt makes 200 observed Students and binds their rows, which keep
// their keys (200 history rows adopted); a second run adopts nothing; the controller
// reports them Ready and writes nothing, its sweep deletes nothing; the other system
// updating 10 of its rows by its own keys shows 10 Drifted and no write; switching
// those 10 to Manage writes exactly their rows; an observed Orphan Student deleted
// keeps its row.
func TestAdopt(t *testing.T) {
	t.Parallel()
	registrytest.ForEach(t, pg, testAdopt)
}

func testAdopt(t *testing.T, b registrytest.Backend) {
	ctx := context.Background()
	bin := ctrlbin.Binary(t)
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := b.New(t)
	reg, err := registry.Open(ctx, url, registry.Options{}) // the schema, as a controller's start makes it
	if err != nil {
		t.Fatal(err)
	}
	reg.Close()
	count := func(query string, args ...any) int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, query, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return n
	}
	// 80 released rows of an earlier cluster, 60 rows of this owner bound to a cluster
	// that is lost, 60 rows another system inserted with the five columns it needs.
	for i := range 80 {
		mustExec(t, db, `INSERT INTO students (uid, namespace, name, student_name, school, generation, created_at, updated_at, released_at, deletion_policy)
			VALUES ($1, $2, $3, $4, '深圳中学', 4, '2026-11-01 08:00:00', '2026-11-01 08:00:00', '2026-11-02 08:00:00', 'Orphan')`,
			fmt.Sprintf("old-%03d", i), ns, fmt.Sprintf("released-%03d", i), fmt.Sprintf("学生 %d", i))
	}
	mustExec(t, db, `INSERT INTO owner_clusters (owner, cluster, bound_at) VALUES ($1, 'lost-cluster', '2026-11-01 08:00:00')`, owner)
	for i := range 60 {
		mustExec(t, db, `INSERT INTO students (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, deletion_policy)
			VALUES ($1, $2, $3, '学生', '深圳中学', $4, 9, '2026-11-01 08:00:00', '2026-11-01 08:00:00', 'Delete')`,
			fmt.Sprintf("lost-%03d", i), ns, fmt.Sprintf("moved-%03d", i), owner)
		mustExec(t, db, `INSERT INTO students (uid, namespace, name, student_name, school) VALUES ($1, $2, $3, '学生', '深圳中学')`,
			fmt.Sprintf("outside-%03d", i), ns, fmt.Sprintf("outside-%03d", i))
	}

	cmdURL, password := registrytest.ForProcess(t, url)
	run := func(args ...string) (string, int) {
		t.Helper()
		// The mark of this test's registry, which no controller keeps: other tests keep
		// marks of the same owner in their namespaces.
		args = append(append(args, "--kubeconfig", env.Kubeconfig, "--registry", cmdURL, "--registry-owner", owner, "--registry-mark-namespace", ns), password...)
		out, err := exec.Command(bin, append([]string{"registry"}, args...)...).CombinedOutput() // #nosec G204 -- the controller built for the test
		code := exitCode(err)
		if code == 1 || code > 2 {
			t.Fatalf("registry %s exited %d: %v\n%s", args[0], code, err, out)
		}
		return string(out), code
	}
	adopted := func(out string) int {
		return len(slices.DeleteFunc(strings.Split(out, "\n"), func(l string) bool { return !strings.HasPrefix(l, "adopt ") }))
	}
	// The owner's rows follow it to this cluster first, as for a rebuilt cluster.
	if out, err := exec.Command(bin, append([]string{"registry", "move-cluster", "--from", "lost-cluster", "--kubeconfig", env.Kubeconfig, // #nosec G204 -- the controller built for the test
		"--registry", cmdURL, "--registry-owner", owner}, password...)...).CombinedOutput(); err != nil {
		t.Fatalf("move-cluster: %v\n%s", err, out)
	}

	before := snapshot(t, ns, db)
	out, code := run("adopt", "--dry-run", "--max-adoptions", "500")
	if code != 2 || adopted(out) != 200 {
		t.Errorf("adopt --dry-run: exit %d, %d to adopt; want 2 and 200:\n%s", code, adopted(out), out)
	}
	if diff := cmp.Diff(before, snapshot(t, ns, db)); diff != "" {
		t.Errorf("adopt --dry-run changed something (-before +after):\n%s", diff)
	}
	if out, code := run("adopt", "--max-adoptions", "100"); code != 2 || !strings.Contains(out, "Refused") || adopted(out) != 0 {
		t.Errorf("adopt past its bound: exit %d; want 2, refused, none adopted:\n%s", code, out)
	}
	if diff := cmp.Diff(before, snapshot(t, ns, db)); diff != "" {
		t.Errorf("adopt past its bound changed something (-before +after):\n%s", diff)
	}

	out, code = run("adopt", "--max-adoptions", "500")
	if code != 0 || !strings.Contains(out, "adopted 200 of 200") {
		t.Errorf("adopt: exit %d; want 0, 200 adopted:\n%s", code, out)
	}
	list, err := students(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Each row keeps its key, the one the system that wrote it uses; the Student names
	// it (row-uid), and the row records the Student's uid.
	if len(list.Items) != 200 {
		t.Fatalf("%d Students, want 200", len(list.Items))
	}
	keys := map[string]studentv1.Student{}
	for _, s := range list.Items {
		if s.Spec.Management != studentv1.ManagementObserve || s.Annotations[studentv1.AnnotationPaused] != "" {
			t.Errorf("Student %s: management %q, annotations %v; want Observe, not paused", s.Name, s.Spec.Management, s.Annotations)
		}
		keys[s.Annotations[studentv1.AnnotationRowUID]] = s
	}
	for key, r := range rowsOf(t, db) {
		s, ok := keys[key]
		if !ok || r.Owner != owner || r.Name != s.Name {
			t.Errorf("row %s (%s, owner %q) is not bound to its Student", key, r.Name, r.Owner)
			continue
		}
		if n := count(`SELECT count(*) FROM students WHERE uid = $1 AND student_uid = $2`, key, string(s.UID)); n != 1 {
			t.Errorf("row %s does not record its Student's uid %s", key, s.UID)
		}
	}
	if n := count(`SELECT count(*) FROM student_history WHERE action = 'adopted'`); n != 200 {
		t.Errorf("history: %d rows adopted, want 200", n)
	}
	if out, code := run("adopt", "--max-adoptions", "500"); code != 0 || !strings.Contains(out, "0 to adopt") {
		t.Errorf("adopt again: exit %d; want 0, nothing to adopt:\n%s", code, out)
	}

	ctl := startController(t, controllerOptions{registryURL: url, namespace: ns, sweepInterval: time.Second})
	waitAllReady(t, ns, 200, 2*time.Minute)
	written := count(`SELECT count(*) FROM student_history`)
	time.Sleep(3 * time.Second) // sweeps
	if n := count(`SELECT count(*) FROM students`); n != 200 {
		t.Errorf("%d rows after the sweeps, want 200", n)
	}
	if n := count(`SELECT count(*) FROM student_history`); n != written {
		t.Errorf("history: %d rows after the sweeps, %d before; want nothing written", n, written)
	}

	// The other system writes 10 of its rows after the adoption, by its own keys:
	// 10 Drifted, nothing written.
	var drifted []studentv1.Student
	for _, s := range list.Items {
		if strings.HasPrefix(s.Name, "outside-") && len(drifted) < 10 {
			drifted = append(drifted, s)
			mustExec(t, db, `UPDATE students SET school = 'elsewhere' WHERE uid = $1`, s.Name) // its key, as it inserted it
		}
	}
	eventually(t, time.Minute, "10 Students Drifted", func(ctx context.Context) (bool, error) {
		l, err := students(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		n := 0
		for _, s := range l.Items {
			if meta.IsStatusConditionTrue(s.Status.Conditions, studentv1.ConditionDrifted) {
				n++
			}
		}
		return n == 10, nil
	})
	if n := count(`SELECT count(*) FROM student_history`); n != written {
		t.Errorf("history: %d rows after the drift, want %d: nothing written", n, written)
	}

	// Those 10 switched to Manage: their rows, and only theirs, are written.
	for _, s := range drifted {
		patch := []byte(`{"spec":{"management":"Manage"}}`)
		if _, err := students(ns).Patch(ctx, s.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitAllReady(t, ns, 200, time.Minute)
	eventually(t, time.Minute, "the 10 rows in line", func(ctx context.Context) (bool, error) {
		var n int
		err := db.QueryRowContext(ctx, `SELECT count(*) FROM students WHERE school = 'elsewhere'`).Scan(&n)
		return n == 0, err
	})
	// Each write, and just before it the row as the other system left it.
	written += 20
	if n := count(`SELECT count(*) FROM student_history`); n != written {
		t.Errorf("history: %d rows after 10 switched to Manage, want %d", n, written)
	}
	for _, s := range drifted {
		if n := count(`SELECT count(*) FROM student_history WHERE uid = $1 AND action = 'updated' AND cause <> 'before-managed'`, s.Name); n != 1 {
			t.Errorf("Student %s: %d rows updated, want 1", s.Name, n)
		}
		if n := count(`SELECT count(*) FROM student_history WHERE uid = $1 AND cause = 'before-managed' AND school = 'elsewhere'`, s.Name); n != 1 {
			t.Errorf("Student %s: %d copies of the row as observed, want 1 (school elsewhere)", s.Name, n)
		}
	}

	// An observed Orphan Student deleted keeps its row.
	gone := list.Items[len(list.Items)-1]
	if gone.Spec.DeletionPolicy != studentv1.DeletionPolicyOrphan {
		t.Fatalf("Student %s has policy %q, want Orphan (from its released row)", gone.Name, gone.Spec.DeletionPolicy)
	}
	if err := students(ns).Delete(ctx, gone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAllReady(t, ns, 199, time.Minute)
	time.Sleep(3 * time.Second) // sweeps
	if r, ok := rowsOf(t, db)[gone.Annotations[studentv1.AnnotationRowUID]]; !ok || r.Owner != owner {
		t.Errorf("the row of the deleted observed Student %s: %+v, %v; want it kept", gone.Name, r, ok)
	}
	ctl.stop()
}
