package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv"
)

// TestLeastPrivilegeRole runs the SQL of docs/prerequisites.md, as written there but for
// the names (a role and a database of this test's), on the suite's PostgreSQL, then the
// controller as that role: it migrates the empty database, writes, updates and deletes
// rows, and starts again on the schema it made.
func TestLeastPrivilegeRole(t *testing.T) {
	ctx := context.Background()
	page, err := os.ReadFile("../../docs/prerequisites.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(page), "```sql\n")
	if !ok {
		t.Fatal("docs/prerequisites.md has no sql block")
	}
	block, _, _ = strings.Cut(block, "```")
	n := time.Now().UnixNano() % 1_000_000
	role, database, password := fmt.Sprintf("least_%d", n), fmt.Sprintf("least_db_%d", n), fmt.Sprintf("pw-%d", n)
	block = regexp.MustCompile(`\bstudent_controller\b`).ReplaceAllString(block, role)
	block = regexp.MustCompile(`\bstudents\b`).ReplaceAllString(block, database)
	block = strings.ReplaceAll(block, "CHANGE-ME", password)

	// As psql would: statement by statement, as the superuser; \c connects to a database.
	admin := func(db string) *sql.DB {
		conn, err := sql.Open("pgx", strings.Replace(pg.URL("postgres", true), "/postgres?", "/"+db+"?", 1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	t.Cleanup(func() {
		// Run last: the controller and the connections below are gone by then.
		server, err := sql.Open("pgx", pg.URL("postgres", true))
		if err != nil {
			t.Error(err)
			return
		}
		defer server.Close()
		for _, drop := range []string{`DROP DATABASE IF EXISTS "` + database + `" WITH (FORCE)`, `DROP ROLE IF EXISTS "` + role + `"`} {
			if _, err := server.ExecContext(ctx, drop); err != nil {
				t.Error(err)
			}
		}
	})
	conn := admin("postgres")
	for line := range strings.SplitSeq(strings.TrimSpace(block), "\n") {
		if db, ok := strings.CutPrefix(line, `\c `); ok {
			conn = admin(strings.TrimSpace(db))
			continue
		}
		if _, err := conn.ExecContext(ctx, line); err != nil {
			t.Fatalf("docs/prerequisites.md's %q: %v", line, err)
		}
	}
	var super, createDB, createRole bool
	if err := conn.QueryRowContext(ctx, `SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = $1`, role).
		Scan(&super, &createDB, &createRole); err != nil || super || createDB || createRole {
		t.Fatalf("the role: superuser %v, createdb %v, createrole %v (%v); want none", super, createDB, createRole, err)
	}

	u := url.URL{Scheme: "postgres", User: url.User(role), Host: pg.Addr(), Path: "/" + database, RawQuery: "sslmode=disable"}
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	args := []string{"--registry", u.String(), "--kubeconfig", controllerID.Kubeconfig, "--namespace", ns,
		"--registry-owner", owner}
	env := []string{"REGISTRY_PASSWORD=" + password}
	p := startProcessEnv(t, "controller", env, args...)
	createMany(t, ns, 3, "least")
	waitAllReady(t, ns, 3, time.Minute)

	db := admin(database)
	var migrations int
	var tableOwner string
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&migrations); err != nil || migrations == 0 {
		t.Fatalf("schema_migrations as the role left it: %d rows, %v", migrations, err)
	}
	if err := db.QueryRowContext(ctx, `SELECT tableowner FROM pg_tables WHERE tablename = 'students'`).Scan(&tableOwner); err != nil || tableOwner != role {
		t.Errorf("the students table's owner: %q, %v; want the role %s", tableOwner, err, role)
	}
	school := func(name string) (string, error) {
		var s string
		err := db.QueryRowContext(ctx, `SELECT school FROM students WHERE namespace = $1 AND name = $2`, ns, name).Scan(&s)
		return s, err
	}
	client := students(ns)
	if _, err := client.Patch(ctx, "least-000", "application/merge-patch+json", []byte(`{"spec":{"school":"北京四中"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.Delete(ctx, "least-001", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the row updated, the deleted Student's row gone", func(context.Context) (bool, error) {
		updated, err := school("least-000")
		if err != nil {
			return false, nil
		}
		_, gone := school("least-001")
		return updated == "北京四中" && gone == sql.ErrNoRows, nil
	})

	// Again, on the schema the role made: nothing to migrate, every Student Ready.
	p.signal(syscall.SIGTERM)
	if err := p.wait(time.Minute); err != nil {
		t.Fatalf("the controller on SIGTERM: %v", err)
	}
	startProcessEnv(t, "controller", env, args...)
	createMany(t, ns, 1, "again")
	waitAllReady(t, ns, 3, time.Minute)
	if _, err := school("again-000"); err != nil {
		t.Errorf("a row written after the restart: %v", err)
	}
}
