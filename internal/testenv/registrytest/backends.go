package registrytest

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/student-controller/student-controller/internal/testenv/pgtest"
)

// Backend is a kind of registry the suites run on.
type Backend struct {
	Name string
	// New makes a fresh, empty registry for one test and returns its URL and a
	// connection to its database as another program would have.
	New func(t *testing.T) (url string, db *sql.DB)
	// Outage takes the registry away until restore is called: another program holds
	// SQLite's write lock; PostgreSQL's server stops, its connections cut.
	Outage func(t *testing.T, db *sql.DB) (restore func())
	// Hold is how long an outage should last at least for a controller to see it.
	Hold time.Duration
}

// SQLiteBackend is a registry in a file of the test's temporary folder.
func SQLiteBackend() Backend {
	return Backend{
		Name: "sqlite",
		New: func(t *testing.T) (string, *sql.DB) {
			path := filepath.Join(t.TempDir(), "registry.db")
			return "sqlite://" + path, OpenSQLite(t, path)
		},
		Outage: func(t *testing.T, db *sql.DB) func() {
			t.Helper()
			ctx := context.Background()
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
				t.Fatal(err)
			}
			return func() {
				_, _ = conn.ExecContext(ctx, "ROLLBACK")
				_ = conn.Close()
			}
		},
	}
}

// databases numbers the PostgreSQL databases of this test binary, so that each test
// gets one of its own on a shared server.
var databases atomic.Int32

// PostgresBackend is a registry in a database of its own on server.
func PostgresBackend(server *pgtest.Server) Backend {
	return Backend{
		Name: "postgres",
		New: func(t *testing.T) (string, *sql.DB) {
			t.Helper()
			return NewDatabase(t, server)
		},
		Outage: func(t *testing.T, _ *sql.DB) func() {
			t.Helper()
			ctx := context.Background()
			if err := server.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := server.Start(ctx); err != nil {
					t.Fatal(err)
				}
			}
		},
		Hold: 20 * time.Second,
	}
}

// Backends are SQLite and PostgreSQL on server.
func Backends(server *pgtest.Server) []Backend {
	return []Backend{SQLiteBackend(), PostgresBackend(server)}
}

// ForEach runs scenario on every kind of registry, PostgreSQL's on server.
func ForEach(t *testing.T, server *pgtest.Server, scenario func(*testing.T, Backend)) {
	for _, b := range Backends(server) {
		t.Run(b.Name, func(t *testing.T) { scenario(t, b) })
	}
}

// NewDatabase creates an empty database on server for one test and returns its URL
// (with the password) and a connection to it.
func NewDatabase(t *testing.T, server *pgtest.Server) (string, *sql.DB) {
	t.Helper()
	url := server.URL(CreateDatabase(t, server), true)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return url, db
}

// CreateDatabase creates an empty database on server for one test and returns its
// name.
func CreateDatabase(t *testing.T, server *pgtest.Server) string {
	t.Helper()
	name := fmt.Sprintf("test_%d", databases.Add(1))
	if err := server.CreateDatabase(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	return name
}

// OpenSQLite connects to the SQLite file at path as another program would.
func OpenSQLite(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// ForProcess is rawURL as a controller process takes it, which refuses a URL that holds
// a password: the URL without it, and the flags that give it from a file of the test's
// (none for a URL without one).
func ForProcess(t *testing.T, rawURL string) (string, []string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil || u.User == nil {
		return rawURL, nil
	}
	password, ok := u.User.Password()
	if !ok {
		return rawURL, nil
	}
	u.User = url.User(u.User.Username())
	file := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(file, []byte(password), 0o600); err != nil {
		t.Fatal(err)
	}
	return u.String(), []string{"--registry-password-file", file}
}
