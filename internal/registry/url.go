package registry

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"
)

// source is a parsed registry URL: which database and how to reach it.
type source struct {
	dialect *dialect
	dsn     string // as the driver takes it; may hold a password
	display string // for logs and errors: never holds a password
}

// parseURL parses a registry URL:
//
//	sqlite:///ABSOLUTE/PATH.db   a SQLite file at an absolute path
//	sqlite:RELATIVE/PATH.db      a SQLite file relative to the working directory
//	postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=...]  (or postgresql://)
//
// password, when not empty, is used for PostgreSQL in place of one in the URL.
func parseURL(raw, password string) (source, error) {
	scheme, rest, ok := strings.Cut(raw, ":")
	if !ok || rest == "" {
		return source{}, fmt.Errorf("registry URL %q: want sqlite:///ABSOLUTE/PATH.db, sqlite:RELATIVE/PATH.db or postgres://USER@HOST:PORT/DATABASE", redact(raw))
	}
	switch scheme {
	case "sqlite":
		return parseSQLite(raw)
	case "postgres", "postgresql":
		return parsePostgres(raw, password)
	default:
		return source{}, fmt.Errorf("registry URL %q: unsupported scheme %q (supported: sqlite, postgres)", redact(raw), scheme)
	}
}

func parseSQLite(raw string) (source, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return source{}, fmt.Errorf("registry URL %q: not a valid URL: %w", redact(raw), urlErrorCause(err))
	}
	path := u.Opaque
	if path == "" {
		if u.Host != "" {
			return source{}, fmt.Errorf("registry URL %q: a SQLite URL has no host; use sqlite:///ABSOLUTE/PATH.db (three slashes) or sqlite:RELATIVE/PATH.db", redact(raw))
		}
		path = u.Path
	}
	if path == "" || strings.HasSuffix(path, "/") {
		return source{}, fmt.Errorf("registry URL %q: names no file", redact(raw))
	}
	if u.RawQuery != "" {
		return source{}, fmt.Errorf("registry URL %q: SQLite URLs take no parameters", redact(raw))
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return source{}, fmt.Errorf("registry URL %q: %w", redact(raw), err)
	}
	return source{dialect: sqlite, dsn: sqliteDSN(abs), display: "sqlite://" + abs}, nil
}

// sqliteBusyTimeout is how long a SQLite statement waits for another connection's lock.
const sqliteBusyTimeout = 5 * time.Second

// sqliteDSN opens the file in WAL mode with a busy timeout, so that other readers and
// writers of the file work while the controller runs, and takes the write lock at the
// start of a transaction rather than failing half way through it. Times are written
// in UTC in SQLite's own datetime() form, which its date functions read.
func sqliteDSN(path string) string {
	q := url.Values{}
	q.Set("_time_format", "datetime")
	q.Set("_timezone", "UTC")
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", sqliteBusyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

// defaultConnectTimeout bounds a connection attempt when the URL does not: an
// unreachable server fails a sync in seconds rather than hanging a worker.
const defaultConnectTimeout = 5 * time.Second

func parsePostgres(raw, password string) (source, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return source{}, fmt.Errorf("registry URL %q: not a valid URL: %w", redact(raw), urlErrorCause(err))
	}
	if u.Host == "" || strings.Trim(u.Path, "/") == "" {
		return source{}, fmt.Errorf("registry URL %q: want postgres://USER@HOST:PORT/DATABASE", redact(raw))
	}
	if password != "" {
		user := ""
		if u.User != nil {
			user = u.User.Username()
		}
		u.User = url.UserPassword(user, password)
	}
	q := u.Query()
	if q.Get("connect_timeout") == "" {
		q.Set("connect_timeout", fmt.Sprint(int(defaultConnectTimeout.Seconds())))
	}
	u.RawQuery = q.Encode()
	display := *u
	display.RawQuery = ""
	return source{dialect: postgres, dsn: u.String(), display: display.Redacted()}, nil
}

// urlErrorCause is what url.Parse found wrong, without the URL that its error quotes,
// password and all.
func urlErrorCause(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err
	}
	return err
}

// redact hides the passwords of a URL that may not even parse, the userinfo's and a
// password parameter's: every error that quotes a registry URL quotes it through here.
// It errs on the side of hiding: text that only looks like a password (after "://", up
// to an "@") is hidden too, wherever a mistyped URL puts it.
func redact(raw string) string {
	out := raw
	if u, err := url.Parse(raw); err == nil {
		if strings.Contains(u.RawQuery, "=") {
			q := u.Query()
			for k := range q {
				if strings.EqualFold(k, "password") {
					q[k] = []string{"xxxxx"}
				}
			}
			u.RawQuery = q.Encode()
		}
		out = u.Redacted()
	}
	// Userinfo after every "://".
	var b strings.Builder
	for {
		i := strings.Index(out, "://")
		if i < 0 {
			b.WriteString(out)
			break
		}
		b.WriteString(out[:i+3])
		out = out[i+3:]
		end := strings.IndexAny(out, "/?#")
		if end < 0 {
			end = len(out)
		}
		if at := strings.LastIndex(out[:end], "@"); at >= 0 {
			if user, _, hasPass := strings.Cut(out[:at], ":"); hasPass {
				b.WriteString(user + ":xxxxx")
				out = out[at:]
			}
		}
	}
	out = b.String()
	// Password parameters, wherever a "?" starts them.
	if base, query, ok := strings.Cut(out, "?"); ok {
		params := strings.Split(query, "&")
		for i, kv := range params {
			if k, _, ok := strings.Cut(kv, "="); ok && strings.EqualFold(k, "password") {
				params[i] = k + "=xxxxx"
			}
		}
		out = base + "?" + strings.Join(params, "&")
	}
	return out
}
