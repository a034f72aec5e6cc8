package registry

import (
	"strconv"
	"strings"
)

// dialect is what differs between the databases the registry runs on.
type dialect struct {
	name string
	// driver is the database/sql driver name; the program registers the driver.
	driver string
	// migrations is the folder of embedded migrations for this database.
	migrations string
	// lockMigrations, when set, is run first in the migration transaction so that two
	// controllers starting at once do not both migrate.
	lockMigrations string
	// numbered placeholders ($1, $2, ...) instead of ?.
	numbered bool
	// timestamp is the column type of a point in time.
	timestamp string
}

var sqlite = &dialect{
	name:       "sqlite",
	driver:     "sqlite",
	migrations: "migrations/sqlite",
	timestamp:  "TIMESTAMP",
	// SQLite takes the file's write lock at BEGIN (the DSN's _txlock=immediate).
}

var postgres = &dialect{
	name:       "postgres",
	driver:     "pgx",
	migrations: "migrations/postgres",
	timestamp:  "TIMESTAMPTZ",
	numbered:   true,
	// A transaction-scoped advisory lock (the key spells "stud"): replicas that start
	// at once migrate one after the other, and the later finds nothing left to do.
	lockMigrations: "SELECT pg_advisory_xact_lock(1937011044)",
}

// rebind rewrites ? placeholders for databases that number them. The registry's own
// queries hold no ? other than placeholders.
func (d *dialect) rebind(query string) string {
	if !d.numbered {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
