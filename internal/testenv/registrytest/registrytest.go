// Package registrytest gives tests what other programs do to a registry: rows written
// past the schema's checks, and the databases' own shells reading it.
package registrytest

import (
	"context"
	"database/sql"
	"fmt"
	"os/exec"
	"strings"
)

// A stored time in the form the SQLite schema asks for.
const storedTime = "2026-11-29 08:00:00"

// WriteMalformed writes rows owned by owner that the registry cannot read, through db
// (a connection to the registry's database, "sqlite" or "postgres"), as a writer that
// bypasses the schema's checks would. It returns the column each row gets wrong, by
// the row's uid.
func WriteMalformed(ctx context.Context, db *sql.DB, database, owner string) (map[string]string, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := BypassChecks(ctx, conn, database); err != nil {
		return nil, err
	}
	// Each row, by uid: the column it gets wrong and the values it holds.
	type row struct{ column, values string }
	var rows map[string]row
	switch database {
	case "sqlite":
		rows = map[string]row{
			"bad-generation": {"generation", `('bad-generation', 'default', 'a', 'A', 'S', $1, 'three', '` + storedTime + `', '` + storedTime + `', NULL)`},
			"bad-time":       {"created_at", `('bad-time', 'default', 'b', 'B', 'S', $1, 1, 'sometime', '` + storedTime + `', NULL)`},
			"bad-blob":       {"student_name", `('bad-blob', 'default', 'c', X'00ff', 'S', $1, 1, '` + storedTime + `', '` + storedTime + `', NULL)`},
			"":               {"uid", `('', 'default', 'd', 'D', 'S', $1, 1, '` + storedTime + `', '` + storedTime + `', NULL)`},
		}
	case "postgres":
		rows = map[string]row{
			"bad-time": {"created_at", `('bad-time', 'default', 'b', 'B', 'S', $1, 1, 'infinity', now(), NULL)`},
			"bad-null": {"school", `('bad-null', 'default', 'c', 'C', NULL, $1, 1, now(), now(), NULL)`},
			"":         {"uid", `('', 'default', 'd', 'D', 'S', $1, 1, now(), now(), NULL)`},
		}
	}
	wrong := map[string]string{}
	for uid, r := range rows {
		// #nosec G202 -- fixed literals above: rows past the schema's checks, on purpose.
		if _, err := conn.ExecContext(ctx, `INSERT INTO students (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, released_at) VALUES `+r.values, owner); err != nil {
			return nil, fmt.Errorf("write malformed row %q: %w", uid, err)
		}
		wrong[uid] = r.column
	}
	if database == "sqlite" {
		_, err = conn.ExecContext(ctx, "PRAGMA ignore_check_constraints = OFF")
	}
	return wrong, err
}

// BypassChecks lets conn write what the schema's checks refuse, as a writer that goes
// around them would: on SQLite it turns the checks off for conn (until it is closed or
// they are turned on again); on PostgreSQL it drops, for good, the checks for finite
// times and a non-empty uid, and school's NOT NULL.
func BypassChecks(ctx context.Context, conn *sql.Conn, database string) error {
	stmts := map[string][]string{
		"sqlite": {"PRAGMA ignore_check_constraints = ON"},
		"postgres": {
			"ALTER TABLE students DROP CONSTRAINT IF EXISTS students_times_finite",
			"ALTER TABLE students DROP CONSTRAINT IF EXISTS students_uid_not_empty",
			"ALTER TABLE students ALTER COLUMN school DROP NOT NULL",
		},
	}[database]
	if stmts == nil {
		return fmt.Errorf("no way around the checks of database %q", database)
	}
	for _, stmt := range stmts {
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return nil
}

// Refused are rows, one per problem, that the schema of database must refuse.
func Refused(database string) map[string]string {
	common := map[string]string{
		"empty uid":          `('', 'default', 'e', 'E', 'S', 'x', 1, '` + storedTime + `', '` + storedTime + `', NULL)`,
		"empty name":         `('u-name', 'default', '', 'E', 'S', 'x', 1, '` + storedTime + `', '` + storedTime + `', NULL)`,
		"NULL school":        `('u-null', 'default', 'e', 'E', NULL, 'x', 1, '` + storedTime + `', '` + storedTime + `', NULL)`,
		"text in generation": `('u-gen', 'default', 'e', 'E', 'S', 'x', 'three', '` + storedTime + `', '` + storedTime + `', NULL)`,
		"unreadable time":    `('u-time', 'default', 'e', 'E', 'S', 'x', 1, 'sometime', '` + storedTime + `', NULL)`,
	}
	switch database {
	case "sqlite":
		common["time in Go's form"] = `('u-go', 'default', 'e', 'E', 'S', 'x', 1, '2026-11-30 09:14:16.803903461 +0000 UTC', '` + storedTime + `', NULL)`
	case "postgres":
		common["infinite time"] = `('u-inf', 'default', 'e', 'E', 'S', 'x', 1, 'infinity', now(), NULL)`
	}
	for k, v := range common {
		common[k] = `INSERT INTO students (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, released_at) VALUES ` + v
	}
	return common
}

// SQLite runs query with Debian's sqlite3 shell on the database file at path and
// returns what it printed, one line per row, columns separated by '|'.
func SQLite(ctx context.Context, path, query string) (string, error) {
	return shell(exec.CommandContext(ctx, "sqlite3", "-batch", "-readonly", path, query))
}

// PSQL runs query with the psql shell on the database at url and returns what it
// printed, one line per row, columns separated by '|'.
func PSQL(ctx context.Context, url, query string) (string, error) {
	return shell(exec.CommandContext(ctx, "psql", "--no-psqlrc", "--tuples-only", "--no-align", "--set=ON_ERROR_STOP=1", "--dbname="+url, "--command="+query))
}

func shell(cmd *exec.Cmd) (string, error) {
	if _, err := exec.LookPath(cmd.Args[0]); err != nil {
		return "", fmt.Errorf("the %s shell is needed (Debian package %s; .ci/run installs it): %w",
			cmd.Args[0], map[string]string{"sqlite3": "sqlite3", "psql": "postgresql-client"}[cmd.Args[0]], err)
	}
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return "", fmt.Errorf("%s: %w: %s", cmd.Args[0], err, ee.Stderr)
		}
		return "", fmt.Errorf("%s: %w", cmd.Args[0], err)
	}
	return strings.TrimSpace(string(out)), nil
}
