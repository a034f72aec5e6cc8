package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// TestPlan: `student-controller plan` against a registry with drift of every kind
// lists each action, exits 2 and changes nothing (the Students and the registry,
// history included, compared before and after); the controller then does what it
// listed, one history row per planned row write; afterwards plan exits 0. An owner
// bound to another cluster is an error (exit 1).
func TestPlan(t *testing.T) { registrytest.ForEach(t, pg, testPlan) }

func testPlan(t *testing.T, b registrytest.Backend) {
	ctx := context.Background()
	bin := ctrlbin.Binary(t)
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := b.New(t)
	client := students(ns)

	ctl := startController(t, controllerOptions{registryURL: url, namespace: ns, sweepInterval: time.Second})
	createMany(t, ns, 6, "s")
	waitAllReady(t, ns, 6, time.Minute)
	ctl.stop()

	// Drift of every kind, with the controller stopped.
	update := func(name string, change func(*studentv1.Student)) {
		t.Helper()
		s, err := client.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(s)
		if _, err := client.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	uid := func(name string) string {
		t.Helper()
		s, err := client.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return string(s.UID)
	}
	update("s-000", func(s *studentv1.Student) { s.Spec.School = "another school" })
	mustExec(t, db, `UPDATE students SET student_name = 'edited by hand' WHERE uid = $1`, uid("s-001"))
	mustExec(t, db, `DELETE FROM students WHERE uid = $1`, uid("s-002"))
	if err := client.Delete(ctx, "s-003", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	update("s-004", func(s *studentv1.Student) { s.Spec.DeletionPolicy = studentv1.DeletionPolicyOrphan })
	if err := client.Delete(ctx, "s-004", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"new", "theirs"} {
		if _, err := client.Create(ctx, newStudent(name, "深圳中学", ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	row := `INSERT INTO students (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, deletion_policy)
		VALUES ($1, $2, $3, 'S', 'School', $4, 1, '2026-11-29 08:00:00', '2026-11-29 08:00:00', 'Delete')`
	mustExec(t, db, row, uid("theirs"), ns, "theirs", "another-owner")
	mustExec(t, db, row, "ghost-uid", ns, "ghost", owner)

	planURL, password := registrytest.ForProcess(t, url)
	args := append([]string{"plan", "--kubeconfig", controllerID.Kubeconfig, "--registry", planURL, "--registry-owner", owner, "--namespace", ns}, password...)
	plan := func(extra ...string) (string, int) {
		t.Helper()
		out, err := exec.Command(bin, append(args, extra...)...).Output() // #nosec G204 -- the controller built for the test
		code := exitCode(err)
		if code == 1 || code > 2 {
			t.Fatalf("plan exited %d: %v\n%s", code, err, out)
		}
		return string(out), code
	}
	before := snapshot(t, ns, db)
	table, code := plan()
	if code != 2 {
		t.Errorf("plan with drift exited %d, want 2:\n%s", code, table)
	}
	want := []string{
		"release s-004 finalizer", "update s-000 spec-change", "update s-001 drift", "restore s-002 restore",
		"delete s-003 finalizer", "create new new-student", "refuse theirs the row is owned by \"another-owner\"",
		"release ghost sweep",
	}
	for _, w := range want {
		f := strings.Fields(w)
		if !slices.ContainsFunc(strings.Split(table, "\n"), func(line string) bool {
			got := strings.Fields(line)
			return len(got) >= 5 && got[0] == f[0] && got[2] == f[1] && strings.Join(got[4:], " ") == strings.Join(f[2:], " ")
		}) {
			t.Errorf("the table lacks %q:\n%s", w, table)
		}
	}
	if !strings.Contains(table, "7 changes.") {
		t.Errorf("the table does not count 7 changes:\n%s", table)
	}
	out, code := plan("-o", "json")
	var report struct {
		Actions []plannedAction
		Rows    int
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil || code != 2 {
		t.Fatalf("plan -o json: exit %d, %v:\n%s", code, err, out)
	}
	var got []string
	for _, a := range report.Actions {
		got = append(got, a.Action+" "+a.Name+" "+a.Cause)
	}
	slices.Sort(got)
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("plan -o json (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, snapshot(t, ns, db)); diff != "" {
		t.Errorf("plan changed something (-before +after):\n%s", diff)
	}
	// With --leader-elect too, which a dry run ignores: a Lease is a write.
	dryRunArgs := append(slices.Clone(args[1:]), "--leader-elect", "--leader-elect-namespace", ns)
	if b.Name == "sqlite" {
		dryRunArgs = append(dryRunArgs, "--sqlite-shared-file")
	}
	dryRun(t, bin, dryRunArgs, report.Actions)
	if leases, err := kubeClient().CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{}); err != nil || len(leases.Items) != 0 {
		t.Errorf("Leases after the dry run: %v, %v; want none", leases, err)
	}
	if diff := cmp.Diff(before, snapshot(t, ns, db)); diff != "" {
		t.Errorf("the dry run changed something (-before +after):\n%s", diff)
	}

	// The controller does what plan said.
	var planned []string
	for _, a := range report.Actions {
		if action := map[string]string{"create": "created", "update": "updated", "restore": "restored", "delete": "deleted", "release": "released"}[a.Action]; action != "" {
			planned = append(planned, a.UID+" "+action+" "+a.Cause)
		}
	}
	slices.Sort(planned)
	startController(t, controllerOptions{registryURL: url, namespace: ns, sweepInterval: time.Second})
	// Ready Students do not say that every row is written (the restored one was Ready
	// all along): wait for the planned writes too.
	eventually(t, time.Minute, "the Students deleted gone, the others in line, the planned writes done", func(ctx context.Context) (bool, error) {
		if len(historySince(t, db, before.LastHistory)) < len(planned) {
			return false, nil
		}
		list, err := client.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		ready := 0
		for _, s := range list.Items {
			if isReady(&s) {
				ready++
			}
		}
		var ghost int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM students WHERE uid = 'ghost-uid' AND owner IS NOT NULL`).Scan(&ghost); err != nil {
			return false, err
		}
		return len(list.Items) == 6 && ready == 5 && ghost == 0, nil
	})
	if diff := cmp.Diff(planned, historySince(t, db, before.LastHistory)); diff != "" {
		t.Errorf("the plan's row writes (-) against what the controller wrote (+):\n%s", diff)
	}
	// The ghost's row, released with its policy Delete, is listed for prune, and is no change.
	if table, code := plan(); code != 0 || !strings.Contains(table, "Nothing would change.") || !strings.Contains(table, "prunable") ||
		!strings.Contains(table, "ghost-uid") {
		t.Errorf("plan after the controller caught up: exit %d, want 0, the ghost's row prunable:\n%s", code, table)
	}

	// An owner bound to another cluster: the controller would refuse to start.
	mustExec(t, db, `DELETE FROM owner_clusters WHERE owner = $1`, owner)
	mustExec(t, db, `INSERT INTO owner_clusters (owner, cluster, bound_at) VALUES ($1, 'another-cluster', '2026-11-29 08:00:00')`, owner)
	cmd := exec.Command(bin, args...) // #nosec G204 -- the controller built for the test
	out2, err := cmd.CombinedOutput()
	if code := exitCode(err); code != 1 || !strings.Contains(string(out2), "bound to cluster another-cluster") {
		t.Errorf("plan for an owner bound to another cluster: exit %d, want 1 and the reason:\n%s", code, out2)
	}

}

type plannedAction struct{ Action, Namespace, Name, UID, Cause string }

// dryRun runs the controller with --dry-run and the controller's flags args until its
// metrics count the actions the plan listed, each logged, and checks that it sent the
// API server nothing but reads (its client's request counts by method).
func dryRun(t *testing.T, bin string, args []string, planned []plannedAction) {
	t.Helper()
	p := startBinary(t, "dry-run", bin, nil, append(args, "--dry-run", "--sweep-interval", "1s")...)
	want := map[string]float64{}
	for _, a := range planned {
		want[a.Action]++
	}
	var body string
	eventually(t, time.Minute, "the dry run's gauge counts the plan's actions", func(ctx context.Context) (bool, error) {
		var err error
		if body, err = testenv.Scrape(p.MetricsAddr, time.Second); err != nil {
			return false, nil
		}
		for _, action := range []string{"add-finalizer", "create", "update", "restore", "delete", "release", "finalize", "refuse"} {
			got := testenv.MetricSum(body, "student_controller_dry_run_planned_actions", func(l string) bool { return l == `action="`+action+`"` })
			if !strings.Contains(body, `student_controller_dry_run_planned_actions{action="`+action+`"}`) || got != want[action] {
				return false, nil
			}
		}
		return true, nil
	})
	for _, a := range planned {
		if !strings.Contains(p.Output(), fmt.Sprintf(`"Dry run: would act" action=%q student=%q uid=%q cause=%q`, a.Action, a.Namespace+"/"+a.Name, a.UID, a.Cause)) {
			t.Errorf("the dry run did not log %+v:\n%s", a, p.Output())
		}
	}
	reads := testenv.MetricSum(body, "rest_client_requests_total", func(l string) bool { return strings.Contains(l, `method="GET"`) })
	others := testenv.MetricSum(body, "rest_client_requests_total", func(l string) bool { return !strings.Contains(l, `method="GET"`) })
	if reads == 0 || others != 0 {
		t.Errorf("the dry run's requests to the API server: %v reads (want some), %v others (want none):\n%s", reads, others,
			grepLines(body, "rest_client_requests_total"))
	}
	p.signal(syscall.SIGTERM)
	if err := p.wait(time.Minute); err != nil {
		t.Errorf("the dry run exited with %v:\n%s", err, p.Output())
	}
}

func grepLines(text, substr string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// state is what a test compares before and after something that must change nothing:
// the Students and Events of a namespace and every row of the registry, history,
// bindings, fences and schema versions included.
type state struct {
	Students, Events, Rows, History []string
	// Registry is the rest of the registry: owner bindings, fences, schema versions.
	Registry []string
	// LastHistory is the id of the last history row.
	LastHistory int64
}

func snapshot(t *testing.T, ns string, db *sql.DB) state {
	t.Helper()
	ctx := context.Background()
	var s state
	list, err := students(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, item := range list.Items {
		s.Students = append(s.Students, fmt.Sprintf("%s %s rv=%s finalizers=%v", item.Name, item.UID, item.ResourceVersion, item.Finalizers))
	}
	events, err := kubeClient().CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		s.Events = append(s.Events, fmt.Sprintf("%s %s count=%d", e.Name, e.Reason, e.Count))
	}
	s.Rows = queryRows(t, db, `SELECT uid || ' ' || coalesce(owner, '-') || ' ' || student_name || ' ' || school || ' ' || CAST(generation AS TEXT) || ' ' || CAST(updated_at AS TEXT) FROM students ORDER BY uid`)
	s.History = queryRows(t, db, `SELECT CAST(id AS TEXT) || ' ' || uid || ' ' || action FROM student_history ORDER BY id`)
	for _, q := range []string{
		`SELECT * FROM owner_clusters ORDER BY owner`,
		`SELECT * FROM fences ORDER BY owner`,
		`SELECT * FROM schema_migrations ORDER BY version`,
	} {
		s.Registry = append(s.Registry, q)
		s.Registry = append(s.Registry, queryRows(t, db, q)...)
	}
	if err := db.QueryRowContext(ctx, `SELECT coalesce(MAX(id), 0) FROM student_history`).Scan(&s.LastHistory); err != nil {
		t.Fatal(err)
	}
	return s
}

// historySince lists the history rows after id as "uid action cause", sorted.
func historySince(t *testing.T, db *sql.DB, id int64) []string {
	t.Helper()
	got := queryRows(t, db, fmt.Sprintf(`SELECT uid || ' ' || action || ' ' || cause FROM student_history WHERE id > %d`, id))
	slices.Sort(got)
	return got
}

// queryRows lists the rows of query, each as its columns' text joined by spaces.
func queryRows(t *testing.T, db *sql.DB, query string) []string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), query)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		values := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range values {
			ptrs[i] = &values[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprint(values...))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
