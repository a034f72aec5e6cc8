package registry

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
)

// source is a parsed registry URL: which database and how to reach it.
type source struct {
	dialect *dialect
	dsn     string // as the driver takes it
	display string // for logs and errors: never holds a password
}

// parseURL parses a registry URL:
//
//	sqlite:///ABSOLUTE/PATH.db   a SQLite file at an absolute path
//	sqlite:RELATIVE/PATH.db      a SQLite file relative to the working directory
func parseURL(raw string) (source, error) {
	scheme, rest, ok := strings.Cut(raw, ":")
	if !ok || rest == "" {
		return source{}, fmt.Errorf("registry URL %q: want sqlite:///ABSOLUTE/PATH.db or sqlite:RELATIVE/PATH.db", raw)
	}
	switch scheme {
	case "sqlite":
		u, err := url.Parse(raw)
		if err != nil {
			return source{}, fmt.Errorf("registry URL %q: %w", raw, err)
		}
		path := u.Opaque
		if path == "" {
			if u.Host != "" {
				return source{}, fmt.Errorf("registry URL %q: a SQLite URL has no host; use sqlite:///ABSOLUTE/PATH.db (three slashes) or sqlite:RELATIVE/PATH.db", raw)
			}
			path = u.Path
		}
		if path == "" || strings.HasSuffix(path, "/") {
			return source{}, fmt.Errorf("registry URL %q: names no file", raw)
		}
		if u.RawQuery != "" {
			return source{}, fmt.Errorf("registry URL %q: SQLite URLs take no parameters", raw)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return source{}, fmt.Errorf("registry URL %q: %w", raw, err)
		}
		return source{dialect: sqlite, dsn: sqliteDSN(abs), display: "sqlite://" + abs}, nil
	default:
		return source{}, fmt.Errorf("registry URL %q: unsupported scheme %q (supported: sqlite)", raw, scheme)
	}
}

// sqliteDSN opens the file in WAL mode with a busy timeout, so that other readers and
// writers of the file work while the controller runs, and takes the write lock at the
// start of a transaction rather than failing half way through it.
func sqliteDSN(path string) string {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}
