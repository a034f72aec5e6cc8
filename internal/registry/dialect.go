package registry

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
	// timestamp is the column type of a point in time.
	timestamp string
	// validTime is a condition, with %[1]s for a column, that holds when the column's
	// time is one the registry can read: the upsert keeps created_at only then.
	validTime string
	// notNewer is a condition, with %[1]s for the stored generation and %[2]s for the
	// one written, that holds when the write may go ahead: the stored generation is not
	// newer, or cannot be read (a row written past the schema, which the write repairs).
	notNewer string
	// tableExists is a query, with $1 for a table's name, whose one row says whether
	// the table exists.
	tableExists string
	// listOwned is the query of List: the rows of the owner $1, by namespace, name and
	// uid unless sortList, when List sorts them so.
	listOwned string
	sortList  bool
	// clock is the registry's time now, as the fences' leases store it; inMillis is
	// that time plus $3 milliseconds; untilMillis, with %[1]s for a column, is the
	// milliseconds from now until the column's time. The registry's clock, not the
	// controllers': two controllers' hosts may disagree about the time.
	clock, inMillis, untilMillis string
	// maxOpenConns and maxIdleConns size the pool when Options leave it to the registry.
	maxOpenConns, maxIdleConns int
}

var sqlite = &dialect{
	name:        "sqlite",
	driver:      "sqlite",
	migrations:  "migrations/sqlite",
	timestamp:   "TIMESTAMP",
	validTime:   "%[1]s = datetime(%[1]s)",
	notNewer:    "(typeof(%[1]s) <> 'integer' OR %[1]s <= %[2]s)",
	tableExists: "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = $1",
	// SQLite takes the file's write lock at BEGIN (the DSN's _txlock=immediate).

	// List reads the owner's rows from the owner index, and sorts them itself, in the
	// byte order of SQLite's BINARY collation: with an ORDER BY, SQLite would sort them
	// in a temporary B-tree (4 MB for 100000 rows, in memory outside Go's heap that the
	// process keeps).
	listOwned: `SELECT ` + columns + ` FROM students WHERE owner = $1`,
	sortList:  true,

	clock:       `strftime('%Y-%m-%d %H:%M:%f', 'now')`,
	inMillis:    `strftime('%Y-%m-%d %H:%M:%f', 'now', ($3 / 1000.0) || ' seconds')`,
	untilMillis: `CAST(round((julianday(%[1]s) - julianday('now')) * 86400000) AS INTEGER)`,

	// Four connections, all kept: one writes at a time (the workers' writes take
	// turns), the others read. Each holds a page cache of up to 2 MiB that fills as the file grows,
	// in memory outside Go's heap, so every connection beyond what the workers use costs
	// memory at scale; one closed when idle costs its cache and prepared statements again
	// when it is opened next.
	maxOpenConns: 4,
	maxIdleConns: 4,
}

var postgres = &dialect{
	name:        "postgres",
	driver:      "pgx",
	migrations:  "migrations/postgres",
	timestamp:   "TIMESTAMPTZ",
	validTime:   "isfinite(%[1]s)",
	notNewer:    "%[1]s <= %[2]s", // BIGINT NOT NULL: always readable
	tableExists: "SELECT to_regclass($1) IS NOT NULL",
	// A transaction-scoped advisory lock (the key spells "stud"): replicas that start
	// at once migrate one after the other, and the later finds nothing left to do.
	lockMigrations: "SELECT pg_advisory_xact_lock(1937011044)",
	listOwned:      `SELECT ` + columns + ` FROM students WHERE owner = $1 ORDER BY namespace, name, uid`,
	clock:          `clock_timestamp()`,
	inMillis:       `clock_timestamp() + $3 * interval '1 millisecond'`,
	untilMillis:    `CAST(round(extract(epoch FROM %[1]s - clock_timestamp()) * 1000) AS BIGINT)`,
	maxOpenConns:   10,
	maxIdleConns:   5,
}
