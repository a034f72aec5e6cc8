package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
	studentclient "github.com/student-controller/student-controller/pkg/generated/clientset/versioned/typed/bolingcavalry/v1"
)

func students(ns string) studentclient.StudentInterface {
	return versioned.NewForConfigOrDie(env.Config).BolingcavalryV1().Students(ns)
}

func newStudent(name, school string, policy studentv1.DeletionPolicy) *studentv1.Student {
	return &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       studentv1.StudentSpec{Name: "学生 " + name, School: school, DeletionPolicy: policy},
	}
}

// createMany creates n Students at once from several goroutines, as a loader would.
func createMany(t *testing.T, ns string, n int, prefix string) {
	t.Helper()
	client := students(ns)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 10)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			_, err := client.Create(context.Background(), newStudent(fmt.Sprintf("%s-%03d", prefix, i), "深圳中学", ""), metav1.CreateOptions{})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// waitAllReady waits until the namespace holds want Students, every one Ready.
func waitAllReady(t *testing.T, ns string, want int, timeout time.Duration) []studentv1.Student {
	t.Helper()
	return waitAllReadyIn(t, students(ns), want, timeout)
}

// waitAllReadyIn is waitAllReady through a client of any control plane: want Students,
// every one Ready at its generation, none Terminating.
func waitAllReadyIn(t *testing.T, client studentclient.StudentInterface, want int, timeout time.Duration) []studentv1.Student {
	t.Helper()
	var items []studentv1.Student
	eventually(t, timeout, fmt.Sprintf("all %d Students Ready", want), func(ctx context.Context) (bool, error) {
		list, err := client.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		items = list.Items
		if len(items) != want {
			return false, nil
		}
		for i := range items {
			if !isReady(&items[i]) || items[i].DeletionTimestamp != nil {
				return false, nil
			}
		}
		return true, nil
	})
	return items
}

// mustExec runs a statement on the registry's database, as another program would.
func mustExec(t *testing.T, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// rowsOf reads every row of the registry file, by UID.
func rowsOf(t *testing.T, db *sql.DB) map[string]registry.Record {
	t.Helper()
	rows, err := db.Query(`SELECT uid, namespace, name, student_name, school, COALESCE(owner, ''), generation FROM students`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]registry.Record{}
	for rows.Next() {
		var r registry.Record
		if err := rows.Scan(&r.UID, &r.Namespace, &r.Name, &r.StudentName, &r.School, &r.Owner, &r.Generation); err != nil {
			t.Fatal(err)
		}
		out[r.UID] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// assertRowsMatch checks that the registry holds exactly one owned row per Student,
// with the Student's spec, and no other owned row.
func assertRowsMatch(t *testing.T, db *sql.DB, items []studentv1.Student) {
	t.Helper()
	want := map[string]registry.Record{}
	for _, s := range items {
		want[string(s.UID)] = registry.Record{
			UID: string(s.UID), Namespace: s.Namespace, Name: s.Name,
			StudentName: s.Spec.Name, School: s.Spec.School, Owner: owner, Generation: s.Generation,
		}
	}
	got := map[string]registry.Record{}
	for uid, r := range rowsOf(t, db) {
		if r.Owner == owner {
			got[uid] = r
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("owned registry rows differ from the Students (-want +got):\n%s", diff)
	}
}

// TestConvergeUpdateRestart: 100 Students converge within the write budget, an update
// reaches its row, and a restarted controller over synced Students writes nothing.
func TestConvergeUpdateRestart(t *testing.T) {
	t.Parallel()
	registrytest.ForEach(t, pg, testConvergeUpdateRestart)
}

func testConvergeUpdateRestart(t *testing.T, b registrytest.Backend) {
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := b.New(t)
	ctrl := startController(t, controllerOptions{registryURL: url, namespace: ns})

	createMany(t, ns, 100, "s")
	items := waitAllReady(t, ns, 100, 2*time.Minute)
	assertRowsMatch(t, db, items)

	writes := ctrl.requests.writes()
	if got := writes["PUT students"] + writes["PATCH students"] + writes["PUT students/status"]; got > 200 {
		t.Errorf("100 new Students cost %d Student writes, want at most 200: %v", got, writes)
	}
	if got := ctrl.registry.writes.Load(); got != 100 {
		t.Errorf("100 new Students cost %d registry writes, want 100", got)
	}

	// An update reaches the row, and only that row.
	s, err := students(ns).Get(context.Background(), "s-042", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.School = "北京四中"
	if _, err := students(ns).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the update to reach the row", func(context.Context) (bool, error) {
		return rowsOf(t, db)[string(s.UID)].School == "北京四中", nil
	})
	items = waitAllReady(t, ns, 100, 30*time.Second)
	assertRowsMatch(t, db, items)

	// Restart over synced Students: every one is synced again (a registry read each),
	// and nothing is written, to the API server or to the registry.
	ctrl.stop()
	restarted := startController(t, controllerOptions{registryURL: url, namespace: ns})
	eventually(t, time.Minute, "the restarted controller to sync every Student", func(context.Context) (bool, error) {
		return restarted.registry.gets.Load() >= 100, nil
	})
	time.Sleep(2 * time.Second) // any write a sync would make follows its read at once
	if got := restarted.requests.writes(); len(got) != 0 {
		t.Errorf("a restart over synced Students wrote to the API server: %v", got)
	}
	if got := restarted.registry.writes.Load(); got != 0 {
		t.Errorf("a restart over synced Students wrote %d registry rows", got)
	}
	assertRowsMatch(t, db, waitAllReady(t, ns, 100, time.Second))
	// One history row per row written: the 100 first rows and the update.
	want := map[string]int{"created/new-student": 100, "updated/spec-change": 1}
	if diff := cmp.Diff(want, historyCounts(t, db, ns)); diff != "" {
		t.Errorf("history rows by action/cause (-want +got):\n%s", diff)
	}
}

// historyCounts counts the history rows of namespace ns by action/cause.
func historyCounts(t *testing.T, db *sql.DB, ns string) map[string]int {
	t.Helper()
	rows, err := db.Query(`SELECT action || '/' || cause, count(*) FROM student_history WHERE namespace = $1 GROUP BY action, cause`, ns)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var key string
		var n int
		if err := rows.Scan(&key, &n); err != nil {
			t.Fatal(err)
		}
		out[key] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDeletePolicies: with Delete the row is gone before the object is; with Orphan the
// row stays, released.
func TestDeletePolicies(t *testing.T) { registrytest.ForEach(t, pg, testDeletePolicies) }

func testDeletePolicies(t *testing.T, b registrytest.Backend) {
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := b.New(t)
	startController(t, controllerOptions{registryURL: url, namespace: ns})
	ctx := context.Background()

	for _, s := range []*studentv1.Student{
		newStudent("delete-me", "深圳中学", studentv1.DeletionPolicyDelete),
		newStudent("keep-my-row", "深圳中学", studentv1.DeletionPolicyOrphan),
	} {
		if _, err := students(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	items := waitAllReady(t, ns, 2, time.Minute)
	uids := map[string]string{}
	for _, s := range items {
		uids[s.Name] = string(s.UID)
	}

	w, err := students(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for _, name := range []string{"delete-me", "keep-my-row"} {
		if err := students(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The moment each object is gone, its row is already gone (Delete) or released (Orphan).
	gone := map[string]registry.Record{}
	timeout := time.After(time.Minute)
	for len(gone) < 2 {
		select {
		case e := <-w.ResultChan():
			if e.Type != watch.Deleted {
				continue
			}
			s := e.Object.(*studentv1.Student)
			gone[s.Name] = rowsOf(t, db)[string(s.UID)]
		case <-timeout:
			t.Fatalf("Students not gone within a minute; gone so far: %v", gone)
		}
	}
	if row := gone["delete-me"]; row.UID != "" {
		t.Errorf("policy Delete: the row was still there when the object was gone: %+v", row)
	}
	row := gone["keep-my-row"]
	if row.UID != uids["keep-my-row"] || row.Owner != "" || row.StudentName != "学生 keep-my-row" {
		t.Errorf("policy Orphan: want the row kept and released, got %+v", row)
	}
	var releasedAt sql.NullString
	if err := db.QueryRow(`SELECT released_at FROM students WHERE uid = $1`, uids["keep-my-row"]).Scan(&releasedAt); err != nil || !releasedAt.Valid {
		t.Errorf("policy Orphan: released_at = %v, %v; want it set", releasedAt, err)
	}
	want := map[string]int{"created/new-student": 2, "deleted/finalizer": 1, "released/finalizer": 1}
	if diff := cmp.Diff(want, historyCounts(t, db, ns)); diff != "" {
		t.Errorf("history rows by action/cause (-want +got):\n%s", diff)
	}
}

// TestSweepRepairsDrift: rows changed, deleted or left behind by others are put right by
// the sweep (resync is off, so nothing else would), and another owner's rows, and the
// owner's rows of a namespace the controller does not watch, are not touched.
func TestSweepRepairsDrift(t *testing.T) { registrytest.ForEach(t, pg, testSweepRepairsDrift) }

func testSweepRepairsDrift(t *testing.T, b registrytest.Backend) {
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := b.New(t)
	startController(t, controllerOptions{registryURL: url, namespace: ns, sweepInterval: 500 * time.Millisecond})

	createMany(t, ns, 3, "d")
	items := waitAllReady(t, ns, 3, time.Minute)
	byName := map[string]studentv1.Student{}
	for _, s := range items {
		byName[s.Name] = s
	}

	// Behind the controller's back: a row deleted, a row changed, an owned row whose
	// Student never existed, and a row of another owner, with times in the table's form.
	now := time.Now().UTC().Format(time.DateTime)
	for _, stmt := range []struct {
		query string
		args  []any
	}{
		{`DELETE FROM students WHERE uid = $1`, []any{string(byName["d-000"].UID)}},
		{`UPDATE students SET school = 'tampered', student_name = 'tampered' WHERE uid = $1`, []any{string(byName["d-001"].UID)}},
		{`INSERT INTO students (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, deletion_policy)
			VALUES ('orphan-uid', $1, 'ghost', 'Ghost', 'Nowhere', $2, 1, $3, $4, 'Delete')`, []any{ns, owner, now, now}},
		{`INSERT INTO students (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at)
			VALUES ('foreign-uid', $1, 'theirs', 'Theirs', 'Elsewhere', 'another-controller', 1, $2, $3)`, []any{ns, now, now}},
		// An owned row of a namespace this controller does not watch: outside its scope.
		{`INSERT INTO students (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, deletion_policy)
			VALUES ('out-of-scope-uid', $1, 'elsewhere', 'Elsewhere', 'Nowhere', $2, 1, $3, $4, 'Delete')`, []any{ns + "-unwatched", owner, now, now}},
	} {
		if _, err := db.Exec(stmt.query, stmt.args...); err != nil {
			t.Fatal(err)
		}
	}

	// The orphan is released, kept with its policy: absence never deletes a row.
	eventually(t, time.Minute, "the sweep to repair the registry", func(context.Context) (bool, error) {
		rows := rowsOf(t, db)
		var released int
		if err := db.QueryRow(`SELECT count(*) FROM students WHERE uid = 'orphan-uid' AND owner IS NULL AND deletion_policy = 'Delete'
			AND released_by = $1 AND release_cause = 'sweep'`, owner).Scan(&released); err != nil {
			return false, err
		}
		return rows[string(byName["d-000"].UID)].UID != "" && rows[string(byName["d-001"].UID)].School == "深圳中学" && released == 1, nil
	})
	time.Sleep(time.Second) // two more sweeps
	if _, ok := rowsOf(t, db)["out-of-scope-uid"]; !ok {
		t.Error("the sweep of a controller that watches one namespace let go of an owned row of another")
	}
	// The rest of the owner's rows are exactly the Students'.
	if _, err := db.Exec(`DELETE FROM students WHERE uid = 'out-of-scope-uid'`); err != nil {
		t.Fatal(err)
	}
	assertRowsMatch(t, db, waitAllReady(t, ns, 3, 10*time.Second))
	foreign := rowsOf(t, db)["foreign-uid"]
	if want := (registry.Record{UID: "foreign-uid", Namespace: ns, Name: "theirs", StudentName: "Theirs", School: "Elsewhere", Owner: "another-controller", Generation: 1}); foreign != want {
		t.Errorf("another owner's row changed: %+v", foreign)
	}
}

// TestRegistryOutage: while the registry is out (SQLite: another program holds the
// file's write lock; PostgreSQL: the server is stopped for 20 s), Students report Ready=False
// with a clear reason and a deleted Student stays Terminating; once it is back,
// everything converges and the rows match the live Students exactly.
func TestRegistryOutage(t *testing.T) {
	t.Parallel()
	registrytest.ForEach(t, pgtest.ForTest(t), testRegistryOutage) // its outage stops the server
}

func testRegistryOutage(t *testing.T, b registrytest.Backend) {
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := b.New(t)
	startController(t, controllerOptions{registryURL: url, namespace: ns})
	ctx := context.Background()

	createMany(t, ns, 5, "before")
	waitAllReady(t, ns, 5, time.Minute)

	restore := b.Outage(t, db)
	outageStarted := time.Now()
	restored := false
	defer func() {
		if !restored {
			restore()
		}
	}()

	createMany(t, ns, 3, "during")
	if err := students(ns).Delete(ctx, "before-000", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOutageShown(t, ns, "during-000")
	deleting, err := students(ns).Get(ctx, "before-000", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the deleted Student went away while its row could not be deleted: %v", err)
	}
	if deleting.DeletionTimestamp == nil || len(deleting.Finalizers) == 0 {
		t.Errorf("the deleted Student is not held Terminating: %+v", deleting.ObjectMeta)
	}
	var events []string
	eventually(t, 20*time.Second, "a RegistryError Event on during-000", func(ctx context.Context) (bool, error) {
		var err error
		events, err = kubeEvents(ctx, ns, "during-000")
		return containsReason(events, controller.EventRegistryError), err
	})
	for _, e := range events {
		if strings.Contains(e, pgtest.Password) {
			t.Errorf("an Event shows the registry password: %s", e)
		}
	}

	if rest := b.Hold - time.Since(outageStarted); rest > 0 {
		time.Sleep(rest) // the outage lasts its full length
	}
	restore()
	restored = true
	items := waitAllReady(t, ns, 7, 2*time.Minute)
	eventually(t, time.Minute, "the deleted Student to go", func(ctx context.Context) (bool, error) {
		_, err := students(ns).Get(ctx, "before-000", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	assertRowsMatch(t, db, items)
	if _, ok := rowsOf(t, db)[string(deleting.UID)]; ok {
		t.Error("the deleted Student's row survived the outage")
	}
}

func kubeEvents(ctx context.Context, ns, name string) ([]string, error) {
	list, err := kubeClient().CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Type+" "+e.Reason+": "+e.Message)
	}
	return out, nil
}

func containsReason(events []string, reason string) bool {
	for _, e := range events {
		if strings.Contains(e, " "+reason+": ") {
			return true
		}
	}
	return false
}
