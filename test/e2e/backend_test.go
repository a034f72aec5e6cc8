package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// backend is a kind of registry the end-to-end scenarios run on.
type backend struct {
	name string
	// newRegistry makes a fresh, empty registry and returns its URL and a connection
	// to it as another program would have.
	newRegistry func(t *testing.T) (string, *sql.DB)
	// outage takes the registry away until restore is called.
	outage func(t *testing.T, db *sql.DB) (restore func())
	// hold is how long an outage lasts at least.
	hold time.Duration
}

var databases atomic.Int32

func backends() []backend {
	return []backend{
		{
			name: "sqlite",
			newRegistry: func(t *testing.T) (string, *sql.DB) {
				path := filepath.Join(t.TempDir(), "registry.db")
				return "sqlite://" + path, rawDB(t, path)
			},
			// Another program takes the file's write lock and keeps it.
			outage: func(t *testing.T, db *sql.DB) func() {
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
					conn.Close()
				}
			},
		},
		{
			name: "postgres",
			newRegistry: func(t *testing.T) (string, *sql.DB) {
				name := fmt.Sprintf("e2e_%d", databases.Add(1))
				if err := pg.CreateDatabase(context.Background(), name); err != nil {
					t.Fatal(err)
				}
				db, err := sql.Open("pgx", pg.URL(name, true))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
				return pg.URL(name, true), db
			},
			// The server stops; connections are cut.
			outage: func(t *testing.T, _ *sql.DB) func() {
				ctx := context.Background()
				if err := pg.Stop(ctx); err != nil {
					t.Fatal(err)
				}
				return func() {
					if err := pg.Start(ctx); err != nil {
						t.Fatal(err)
					}
				}
			},
			hold: 20 * time.Second,
		},
	}
}

// forEachBackend runs a scenario on every kind of registry.
func forEachBackend(t *testing.T, scenario func(*testing.T, backend)) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) { scenario(t, b) })
	}
}
