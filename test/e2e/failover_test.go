package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
)

// replicatedRegistry is a PostgreSQL primary with a streaming standby, and a registry
// URL that names both, the way a controller is pointed at a replicated database.
type replicatedRegistry struct {
	primary, standby *pgtest.Server
	url              string
}

func newReplicatedRegistry(t *testing.T) *replicatedRegistry {
	t.Helper()
	ctx := context.Background()
	primary, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Close() })
	if err := primary.CreateDatabase(ctx, "registry"); err != nil {
		t.Fatal(err)
	}
	standby, err := primary.StartStandby(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	u := url.URL{Scheme: "postgres", User: url.User("postgres"),
		Host: fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d", primary.Port(), standby.Port()), Path: "/registry", RawQuery: "sslmode=disable"}
	return &replicatedRegistry{primary: primary, standby: standby, url: u.String()}
}

// db opens server's registry database as another program would.
func (r *replicatedRegistry) db(t *testing.T, server *pgtest.Server) *sql.DB {
	t.Helper()
	return openPG(t, server, "registry")
}

// openPG opens database db of a test PostgreSQL server as its administrator.
func openPG(t *testing.T, server *pgtest.Server, db string) *sql.DB {
	t.Helper()
	conn, err := sql.Open("pgx", server.URL(db, true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitReplicated waits until the standby holds n rows.
func (r *replicatedRegistry) waitReplicated(t *testing.T, n int) {
	t.Helper()
	standby := r.db(t, r.standby)
	waitFor(t, 30*time.Second, fmt.Sprintf("%d rows on the standby", n), func() bool {
		var got int
		return standby.QueryRow(`SELECT count(*) FROM students`).Scan(&got) == nil && got == n
	})
}

// TestPostgresFailover: the controller, given both hosts of a replicated registry,
// goes on on the new primary after a fail-over and loses nothing: when the primary is
// killed while Students are written and the standby promoted (rows the standby had
// not received yet are written again by the sweep), and when the primary turns
// read-only under the controller's open connections (SQLSTATE 25006: they are dropped,
// rather than failing every write until their lifetime ends).
func TestPostgresFailover(t *testing.T) {
	t.Parallel()
	// A controller on both hosts, and five Students written and replicated.
	setUp := func(t *testing.T) (*replicatedRegistry, string) {
		ns := testenv.Namespace(t, kubeClient(), "e2e-")
		r := newReplicatedRegistry(t)
		startProcessEnv(t, "controller", []string{"REGISTRY_PASSWORD=" + pgtest.Password}, "--kubeconfig", controllerID.Kubeconfig, "--namespace", ns,
			"--registry", r.url, "--registry-owner", owner, "--sweep-interval", "2s")
		createMany(t, ns, 5, "before")
		waitAllReady(t, ns, 5, time.Minute)
		r.waitReplicated(t, 5)
		return r, ns
	}

	t.Run("primary killed while Students are written", func(t *testing.T) {
		ctx := context.Background()
		r, ns := setUp(t)

		var wg sync.WaitGroup
		errs := make(chan error, 1)
		wg.Go(func() {
			for i := range 30 {
				if _, err := students(ns).Create(ctx, newStudent(fmt.Sprintf("during-%03d", i), "深圳中学", ""), metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
		time.Sleep(time.Second)
		if err := r.primary.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := r.standby.Promote(ctx); err != nil {
			t.Fatal(err)
		}
		promoted := time.Now()
		wg.Wait()
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		assertRowsMatch(t, r.db(t, r.standby), waitAllReady(t, ns, 35, 2*time.Minute))
		t.Logf("every Student Ready %v after the standby was promoted", time.Since(promoted).Round(100*time.Millisecond))
	})

	t.Run("primary turned read-only", func(t *testing.T) {
		ctx := context.Background()
		r, ns := setUp(t)

		// As an operator fails over: the primary turned read-only first, the standby
		// caught up with it, then promoted. Promoted first, the old primary would take
		// writes until its connections reloaded the setting, and they would be lost.
		primary := r.db(t, r.primary)
		for _, stmt := range []string{`ALTER SYSTEM SET default_transaction_read_only = on`, `SELECT pg_reload_conf()`} {
			if _, err := primary.ExecContext(ctx, stmt); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 30*time.Second, "the primary read-only", func() bool {
			var on string
			return primary.QueryRowContext(ctx, `SHOW default_transaction_read_only`).Scan(&on) == nil && on == "on"
		})
		// The setting holds for new transactions: let any that began before it end.
		waitFor(t, 30*time.Second, "no write transaction open on the primary", func() bool {
			var open int
			return primary.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()`).Scan(&open) == nil && open == 0
		})
		var lsn string
		if err := primary.QueryRowContext(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		standby := r.db(t, r.standby)
		waitFor(t, 30*time.Second, "the standby caught up with the primary", func() bool {
			var caughtUp bool
			return standby.QueryRowContext(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&caughtUp) == nil && caughtUp
		})
		if err := r.standby.Promote(ctx); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		createMany(t, ns, 5, "after")
		assertRowsMatch(t, r.db(t, r.standby), waitAllReady(t, ns, 10, time.Minute))
		t.Logf("the Students created after the primary turned read-only were Ready after %v", time.Since(began).Round(100*time.Millisecond))
	})
}
