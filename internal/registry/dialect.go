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
}

var sqlite = &dialect{
	name:       "sqlite",
	driver:     "sqlite",
	migrations: "migrations/sqlite",
	// SQLite takes the file's write lock at BEGIN (the DSN's _txlock=immediate).
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
