package registry

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzParseURL: whatever the registry URL and the password given beside it, parsing
// never panics, and no password shows in the error or in the URL shown for the
// registry (its String(), in logs and status).
//
// A password counts as shown when it is in the output for the URL and not in the
// output for the same URL with the password replaced: text that the templates or
// another part of the URL hold as well is no leak.
func FuzzParseURL(f *testing.F) {
	for _, seed := range []struct{ raw, password string }{
		{"sqlite:///var/lib/registry.db", ""},
		{"sqlite:registry.db", ""},
		{"sqlite://user:hunter2secret@host/registry.db", ""},
		{"sqlite:///x.db?password=hunter2secret", ""},
		{"sqlite://u:hunter2secret@[::1/x.db", ""},
		{"sqlite:x.db%zz?password=hunter2secret", ""},
		{"postgres://app:hunter2secret@db:5432/students?sslmode=disable", ""},
		{"postgresql://app@db/students", "hunter2secret"},
		{"postgres://app:hunter2secret@db", ""},
		{"postgres://db/?password=hunter2secret", ""},
		{"postgres://db/students?password=hunter2secret&sslmode=require", ""},
		{"postgres://app:hunter%zzsecret@db/students", ""},
		{"postgres://app:hunt@er2secret@db/students", ""},
		{"postgres://[::1:hunter2secret@db/students", ""},
		{"mysql://app:hunter2secret@db/students", ""},
		{"postgres://app:hunter2secret@db/students#frag", ""},
		{":", ""},
		{"", "hunter2secret"},
		{"host=db user=app password=hunter2secret dbname=students", ""},
		{"user=app password='hunter2 secret' host=db", ""},
		{"postgres://app:hunter2/secret@db/students", ""},
		{"postgres://app:hunter2?sec#ret@db/students", ""},
		{"postgres:app:hunter2secret@db/students", ""},
		{"postgres://app:ab@cd:hunter2secret@db/x", ""},
	} {
		f.Add(seed.raw, seed.password)
	}
	f.Fuzz(func(t *testing.T, raw, password string) {
		show := func(raw, password string) string {
			src, err := parseURL(raw)
			if err != nil {
				return err.Error()
			}
			return src.display
		}
		shown := show(raw, password)
		// check fails when secret is shown and is no longer shown once the password
		// (what swap swaps for another string) is another.
		check := func(secret string, swap func(other string) (string, string)) {
			if len(secret) < 6 || !strings.Contains(shown, secret) {
				return // a password of a letter or two is in any text
			}
			other := strings.Repeat("Q", len(secret))
			if strings.Contains(secret, "Q") {
				other = strings.Repeat("J", len(secret))
			}
			if !strings.Contains(show(swap(other)), secret) {
				t.Errorf("parseURL(%q, %q) shows the password %q: %s", raw, password, secret, shown)
			}
		}
		check(password, func(other string) (string, string) { return raw, other })
		if src, err := parseURL(raw); err == nil && src.withPassword != nil && password != "" {
			if got := src.withPassword(password); !strings.Contains(got, url.UserPassword("u", password).String()[2:]) {
				t.Errorf("parseURL(%q).withPassword(%q) = %q: the password is not in the DSN", raw, password, got)
			}
		}
		for _, p := range passwordsIn(raw) {
			swap := func(other string) (string, string) { return raw[:p.start] + other + raw[p.end:], password }
			check(raw[p.start:p.end], swap)
			if dec, err := url.QueryUnescape(raw[p.start:p.end]); err == nil {
				check(dec, swap)
			}
		}
	})
}

// span is where in a URL a password is written.
type span struct{ start, end int }

// passwordsIn returns where a registry URL holds passwords: its userinfo's, and its
// password parameters'.
func passwordsIn(raw string) []span {
	var out []span
	if i := strings.Index(raw, "://"); i >= 0 {
		from := i + len("://")
		// Up to the last "@" before any further "://": an unescaped password may hold
		// "/", "?", "#" and "@".
		authority := raw[from:]
		if j := strings.Index(authority, "://"); j >= 0 {
			authority = authority[:j]
		}
		if at := strings.LastIndex(authority, "@"); at >= 0 {
			if colon := strings.Index(authority[:at], ":"); colon >= 0 {
				out = append(out, span{from + colon + 1, from + at})
			}
		}
	} else if scheme, rest, ok := strings.Cut(raw, ":"); ok {
		// The opaque form, scheme:user:password@host.
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if colon := strings.Index(rest[:at], ":"); colon >= 0 {
				from := len(scheme) + 1
				out = append(out, span{from + colon + 1, from + at})
			}
		}
	}
	if keywordDSN.MatchString(raw) {
		for _, m := range keywordPassword.FindAllStringSubmatchIndex(raw, -1) {
			out = append(out, span{m[4], m[5]})
		}
	}
	beforeFragment, _, _ := strings.Cut(raw, "#")
	if q := strings.Index(beforeFragment, "?"); q >= 0 {
		pos := q + 1
		for _, kv := range strings.Split(beforeFragment[q+1:], "&") {
			if k, _, ok := strings.Cut(kv, "="); ok && strings.EqualFold(k, "password") {
				out = append(out, span{pos + len(k) + 1, pos + len(kv)})
			}
			pos += len(kv) + 1
		}
	}
	return out
}
