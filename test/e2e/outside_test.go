package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// TestShellsReadRegistry: the databases' own shells, sqlite3 and psql, read the times
// in a registry the controller wrote with their date functions, and get what the
// Students' status says.
func TestShellsReadRegistry(t *testing.T) { registrytest.ForEach(t, pg, testShellsReadRegistry) }

func testShellsReadRegistry(t *testing.T, b registrytest.Backend) {
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, _ := b.New(t)
	startController(t, controllerOptions{registryURL: url, namespace: ns})
	ctx := context.Background()
	for _, s := range []*studentv1.Student{
		newStudent("a", "深圳中学", ""), newStudent("b", "北京四中", ""),
		newStudent("released", "深圳中学", studentv1.DeletionPolicyOrphan),
	} {
		if _, err := students(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	items := waitAllReady(t, ns, 3, time.Minute)
	if err := students(ns).Delete(ctx, "released", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the Orphan Student gone", func(ctx context.Context) (bool, error) {
		_, err := students(ns).Get(ctx, "released", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})

	// Per row: the name, when it was last written, and whether the database's date
	// arithmetic finds it written after its creation, within the last hour, and (for
	// the released row) released then too.
	var query string
	var run func(ctx context.Context, query string) (string, error)
	switch b.Name {
	case "sqlite":
		query = `SELECT name, datetime(updated_at),
			created_at <= updated_at AND (julianday('now') - julianday(updated_at)) * 24 BETWEEN 0 AND 1,
			coalesce(julianday(released_at) = julianday(updated_at), '-')
			FROM students ORDER BY name`
		run = func(ctx context.Context, query string) (string, error) {
			return registrytest.SQLite(ctx, strings.TrimPrefix(url, "sqlite://"), query)
		}
	case "postgres":
		query = `SELECT name, to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),
			CASE WHEN created_at <= updated_at AND now() - updated_at BETWEEN interval '0' AND interval '1 hour' THEN 1 ELSE 0 END,
			CASE WHEN released_at IS NULL THEN '-' WHEN released_at = updated_at THEN '1' ELSE '0' END
			FROM students ORDER BY name`
		run = func(ctx context.Context, query string) (string, error) { return registrytest.PSQL(ctx, url, query) }
	}
	got, err := run(ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, s := range items {
		if s.Name == "released" {
			want = append(want, "released|") // written again on release: checked below
			continue
		}
		written := s.Status.Registry.LastWrittenTime.UTC().Format(time.DateTime)
		want = append(want, fmt.Sprintf("%s|%s|1|-", s.Name, written))
	}
	slices.Sort(want)
	lines := strings.Split(got, "\n")
	for i, line := range lines {
		if strings.HasPrefix(line, "released|") {
			if !strings.HasSuffix(line, "|1|1") {
				t.Errorf("the released row reads %q, want it written and released now", line)
			}
			lines[i] = "released|"
		}
	}
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("%s read the registry (-want +got):\n%s", b.Name, diff)
	}
}

// TestMalformedRowsSkipped: rows under the controller's owner mark that it cannot read
// (written past the schema's checks) are counted and left alone, while the sweep still
// restores a deleted row, deletes an orphan, and a Student's own broken row is rewritten.
func TestMalformedRowsSkipped(t *testing.T) { registrytest.ForEach(t, pg, testMalformedRowsSkipped) }

func testMalformedRowsSkipped(t *testing.T, b registrytest.Backend) {
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := b.New(t)
	ctl := startController(t, controllerOptions{registryURL: url, namespace: ns, sweepInterval: time.Second})
	ctx := context.Background()
	createMany(t, ns, 3, "s")
	items := waitAllReady(t, ns, 3, time.Minute)

	wrong, err := registrytest.WriteMalformed(ctx, db, b.Name, owner)
	if err != nil {
		t.Fatal(err)
	}
	// Behind the controller's back: one Student's row deleted, another's broken past
	// the checks, an orphan row added.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := registrytest.BypassChecks(ctx, conn, b.Name); err != nil {
		t.Fatal(err)
	}
	breakRow := map[string]string{
		"sqlite":   `UPDATE students SET generation = 'three' WHERE uid = $1`,
		"postgres": `UPDATE students SET created_at = 'infinity' WHERE uid = $1`,
	}[b.Name]
	for _, stmt := range []struct {
		sql  string
		args []any
	}{
		{breakRow, []any{string(items[1].UID)}},
		{`DELETE FROM students WHERE uid = $1`, []any{string(items[0].UID)}},
		{`INSERT INTO students (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, released_at) VALUES ('ghost', $1, 'ghost', 'G', 'S', $2, 1, '2026-11-29 08:00:00', '2026-11-29 08:00:00', NULL)`, []any{ns, owner}},
	} {
		if _, err := conn.ExecContext(ctx, stmt.sql, stmt.args...); err != nil {
			t.Fatalf("%s: %v", stmt.sql, err)
		}
	}
	conn.Close()

	reader, err := registry.Open(ctx, url, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	eventually(t, time.Minute, "every Student's row in line beside the malformed rows", func(ctx context.Context) (bool, error) {
		rows, malformed, err := reader.List(ctx, owner)
		if err != nil {
			return false, err
		}
		if len(rows) != len(items) || len(malformed) != len(wrong) {
			return false, nil
		}
		for i, row := range rows {
			s := items[i]
			if row.UID != string(s.UID) || row.StudentName != s.Spec.Name || row.Generation != s.Generation {
				return false, nil
			}
		}
		for _, m := range malformed {
			if _, ok := wrong[m.UID]; !ok {
				return false, fmt.Errorf("row %q reported malformed: %s", m.UID, m.Problem)
			}
		}
		return true, nil
	})
	eventually(t, 30*time.Second, "the metric counting the malformed rows", func(context.Context) (bool, error) {
		families, err := ctl.metrics.Gather()
		if err != nil {
			return false, err
		}
		for _, f := range families {
			if f.GetName() == "student_controller_registry_malformed_rows" {
				return f.GetMetric()[0].GetGauge().GetValue() == float64(len(wrong)), nil
			}
		}
		return false, nil
	})
}
