package registry

import (
	"net/url"
	"strings"
	"testing"
)

// TestPostgresDefaults: without sslmode a PostgreSQL URL means verify-full (pgx's own
// default, prefer, falls back to plaintext without a word); only sslmode=disable gives
// plaintext. target_session_attrs defaults to read-write.
func TestPostgresDefaults(t *testing.T) {
	tests := map[string]struct{ raw, sslmode, attrs string }{
		"nothing said":           {"postgres://app@db/students", "verify-full", "read-write"},
		"disable":                {"postgres://app@db/students?sslmode=disable", "disable", "read-write"},
		"require":                {"postgresql://app@db/students?sslmode=require", "require", "read-write"},
		"any, by its own choice": {"postgres://app@db/students?target_session_attrs=any", "verify-full", "any"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			src, err := parseURL(tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			u, err := url.Parse(src.dsn)
			if err != nil {
				t.Fatal(err)
			}
			if got := u.Query().Get("sslmode"); got != tc.sslmode {
				t.Errorf("sslmode = %q, want %q", got, tc.sslmode)
			}
			if got := u.Query().Get("target_session_attrs"); got != tc.attrs {
				t.Errorf("target_session_attrs = %q, want %q", got, tc.attrs)
			}
		})
	}
}

// TestRegistryURLErrorsHidePasswords: URLs that do not parse, with a password that
// holds what ends an authority ("/", "?", "#", "@"), or in the opaque form: the error
// never shows the password or a piece of it.
func TestRegistryURLErrorsHidePasswords(t *testing.T) {
	for _, raw := range []string{
		"postgres://app:hunter2/secret@db/students",
		"postgres://app:ab/cd@db:5432:1/x",
		"postgres://app:hunter2?sec#ret@db/students",
		"postgres:app:hunter2secret@db/students",
		"postgres://app:pa@ss:word2secret@db:1:2/x",
		"sqlite://app:hunter2/secret@host/x.db",
	} {
		shown := ""
		if src, err := parseURL(raw); err != nil {
			shown = err.Error()
		} else {
			shown = src.display
		}
		for _, piece := range []string{"hunter2", "secret", "sec#ret", "cd@", "word2"} {
			if strings.Contains(shown, piece) {
				t.Errorf("parseURL(%q) shows %q: %s", raw, piece, shown)
			}
		}
	}
}
