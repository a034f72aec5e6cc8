package registry

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// source is a parsed registry URL: which database and how to reach it.
type source struct {
	dialect *dialect
	dsn     string // as the driver takes it; may hold a password
	display string // for logs and errors: never holds a password
	// withPassword is dsn with another password, for PostgreSQL.
	withPassword func(password string) string
	// path is the SQLite file.
	path string
}

// URL is a registry URL, parsed once (ParseURL): what Open, Backup and Connect take.
type URL struct {
	src      source
	password bool
}

// ParseURL parses a registry URL (see parseURL for the forms it takes) without
// connecting. Its errors never hold the password.
func ParseURL(raw string) (URL, error) {
	src, err := parseURL(raw)
	if err != nil {
		return URL{}, err
	}
	return URL{src: src, password: HasPassword(raw)}, nil
}

// String is how the URL is shown: never with its password.
func (u URL) String() string { return u.src.display }

// SQLite tells whether the registry is a SQLite file.
func (u URL) SQLite() bool { return u.src.dialect == sqlite }

// HasPassword tells whether the URL carries a password (see the function HasPassword).
func (u URL) HasPassword() bool { return u.password }

// HasPassword tells whether a registry URL carries a password in its userinfo or
// its parameters. The controller refuses such a URL: a password there shows in the
// process list and in the Pod's spec.
func HasPassword(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		return redact(rawURL) != rawURL
	}
	if _, inUserinfo := u.User.Password(); inUserinfo {
		return true
	}
	for k := range u.Query() {
		if strings.EqualFold(k, "password") || strings.EqualFold(k, "sslpassword") {
			return true
		}
	}
	return false
}

// parseURL parses a registry URL:
//
//	sqlite:///ABSOLUTE/PATH.db   a SQLite file at an absolute path
//	sqlite:RELATIVE/PATH.db      a SQLite file relative to the working directory
//	postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=...]  (or postgresql://)
//
// A keyword/value string (host=... user=...) is refused without being shown: it is
// the form a password is most often pasted into.
func parseURL(raw string) (source, error) {
	if keywordDSN.MatchString(raw) {
		return source{}, errors.New("registry: a keyword/value connection string (host=... user=...) is not taken, and is not shown here since it may hold a password: " +
			"give a URL, postgres://USER@HOST:PORT/DATABASE, and the password with --registry-password-file or REGISTRY_PASSWORD")
	}
	scheme, rest, ok := strings.Cut(raw, ":")
	if !ok || rest == "" {
		return source{}, fmt.Errorf("registry URL %q: want sqlite:///ABSOLUTE/PATH.db, sqlite:RELATIVE/PATH.db or postgres://USER@HOST:PORT/DATABASE", redact(raw))
	}
	switch scheme {
	case "sqlite":
		return parseSQLite(raw)
	case "postgres", "postgresql":
		return parsePostgres(raw)
	default:
		return source{}, fmt.Errorf("registry URL %q: unsupported scheme %q (supported: sqlite, postgres)", redact(raw), scheme)
	}
}

func parseSQLite(raw string) (source, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return source{}, fmt.Errorf("registry URL %q: not a valid URL: %w", redact(raw), urlErrorCause(raw, err))
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
	return source{dialect: sqlite, dsn: sqliteDSN(abs), display: "sqlite://" + abs, path: abs}, nil
}

// readOnly makes src open connections that cannot write: SQLite opens the file
// read-only (mode=ro) and refuses writes (query_only), and leaves its journal mode
// alone (a WAL file's -shm and -wal are made when missing, as for any reader);
// PostgreSQL starts every transaction READ ONLY, on the primary.
func (src source) readOnly() source {
	switch src.dialect {
	case sqlite:
		src.dsn = sqliteReadOnlyDSN(src.path, true)
	case postgres:
		// pgx tells read-write by asking transaction_read_only, which is now on in
		// every session: the primary is the server not in recovery.
		readOnly := func(dsn string) string {
			return withParams(dsn, "default_transaction_read_only", "on", "target_session_attrs", "primary")
		}
		src.dsn = readOnly(src.dsn)
		withPassword := src.withPassword
		src.withPassword = func(password string) string { return readOnly(withPassword(password)) }
	}
	return src
}

// sqliteReadOnlyDSN opens the file at path read-only (mode=ro), and with queryOnly
// refuses every write too; without it a backup may write its copy elsewhere (VACUUM
// INTO), which query_only refuses.
func sqliteReadOnlyDSN(path string, queryOnly bool) string {
	q := url.Values{}
	q.Set("mode", "ro")
	q.Set("_time_format", "datetime")
	q.Set("_timezone", "UTC")
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", sqliteBusyTimeout.Milliseconds()))
	if queryOnly {
		q.Add("_pragma", "query_only(1)")
	}
	return "file:" + path + "?" + q.Encode()
}

// withParams sets query parameters (key, value, ...) of a URL that parsePostgres made.
func withParams(raw string, kv ...string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw // parsePostgres parsed it; it parses
	}
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// sqliteBusyTimeout is how long a SQLite statement waits for another connection's lock.
const sqliteBusyTimeout = 5 * time.Second

// sqliteDSN opens the file in WAL mode with a busy timeout, so that other readers and
// writers of the file work while the controller runs, and takes the write lock at the
// start of a transaction rather than failing half way through it. Every commit is
// synced to disk (synchronous FULL): with WAL's NORMAL a power loss can roll back a
// release or delete that the controller already acted on. Times are written
// in UTC in SQLite's own datetime() form, which its date functions read.
func sqliteDSN(path string) string {
	q := url.Values{}
	q.Set("_time_format", "datetime")
	q.Set("_timezone", "UTC")
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", sqliteBusyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

// defaultConnectTimeout bounds a connection attempt when the URL does not: an
// unreachable server fails a sync in seconds rather than hanging a worker.
const defaultConnectTimeout = 5 * time.Second

// PostgreSQL URLs get, unless they say otherwise: TLS that checks the server's name and
// certificate (sslmode=verify-full; plaintext only with sslmode=disable, since pgx's
// own default, prefer, falls back to it silently), and a server that takes writes
// (target_session_attrs=read-write: with several hosts, the primary).
// The server also ends a session that stays idle inside a transaction for 30 s
// (idle_in_transaction_session_timeout, in ms): a controller paused in the middle of a
// write would otherwise hold its locks, the write fence's among them, for as long as
// its connection lives.
var postgresDefaults = map[string]string{
	"connect_timeout":                     fmt.Sprint(int(defaultConnectTimeout.Seconds())),
	"sslmode":                             "verify-full",
	"target_session_attrs":                "read-write",
	"idle_in_transaction_session_timeout": "30000",
}

func parsePostgres(raw string) (source, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return source{}, fmt.Errorf("registry URL %q: not a valid URL: %w", redact(raw), urlErrorCause(raw, err))
	}
	if u.Host == "" || strings.Trim(u.Path, "/") == "" {
		return source{}, fmt.Errorf("registry URL %q: want postgres://USER@HOST:PORT/DATABASE", redact(raw))
	}
	q := u.Query()
	for k, v := range postgresDefaults {
		if q.Get(k) == "" {
			q.Set(k, v)
		}
	}
	u.RawQuery = q.Encode()
	display := *u
	display.RawQuery = ""
	withPassword := func(password string) string {
		if password == "" {
			return u.String()
		}
		with := *u
		with.User = url.UserPassword(u.User.Username(), password)
		return with.String()
	}
	return source{dialect: postgres, dsn: u.String(), display: display.Redacted(), withPassword: withPassword}, nil
}

// keywordDSN matches a libpq keyword/value connection string.
var keywordDSN = regexp.MustCompile(`^\s*[A-Za-z_]+\s*=`)

// keywordPassword matches a password in keyword/value form, quoted or not.
var keywordPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)`)

// hideUserinfo hides the password of the userinfo that segment starts with (the text
// after "://"), or, for the first segment, of an opaque "scheme:user:pass@host" form.
func hideUserinfo(segment string, afterSlashes bool) string {
	at := strings.LastIndex(segment, "@")
	if at < 0 {
		return segment
	}
	prefix, userinfo := "", segment[:at]
	if !afterSlashes {
		scheme, rest, ok := strings.Cut(userinfo, ":")
		if !ok {
			return segment
		}
		prefix, userinfo = scheme+":", rest
	}
	user, _, hasPass := strings.Cut(userinfo, ":")
	if !hasPass {
		return segment
	}
	return prefix + user + ":xxxxx" + segment[at:]
}

// urlErrorCause is what url.Parse found wrong, without the URL that its error quotes,
// password and all.
func urlErrorCause(raw string, err error) error {
	if strings.Contains(raw, "@") {
		// Its words may quote a part of the userinfo ("invalid port" of a password).
		return errors.New("it does not parse (the parser's words are not shown: they may quote the password)")
	}
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
	// Userinfo after every "://", up to the last "@" before the next "://": a password
	// may hold "/", "?", "#" or "@" when it is not escaped, and URL parsing then fails.
	var b strings.Builder
	for first := true; ; first = false {
		i := strings.Index(out, "://")
		if i < 0 {
			b.WriteString(hideUserinfo(out, !first))
			break
		}
		b.WriteString(hideUserinfo(out[:i], !first) + "://")
		out = out[i+3:]
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
	return keywordPassword.ReplaceAllString(out, "${1}xxxxx")
}
