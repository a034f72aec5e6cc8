package codegen

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/student-controller/student-controller/internal/testenv"
)

// TestReleaseRefusesWhatItCannotTrust: make release and make publish refuse a REGISTRY
// outside the OCI reference grammar (a shell's command substitution, a quote, make's
// own $(shell ...)), a VERSION that is not semver, a DIST outside dist/ and a REVISION
// that is no commit, before they build or run anything; make release refuses a tree
// with changes.
func TestReleaseRefusesWhatItCannotTrust(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join(t.TempDir(), "ran")
	for _, c := range []struct {
		target string
		vars   []string
		want   string
	}{
		{"release", []string{"REGISTRY=r.io/x`touch " + mark + "`"}, "is not a registry and path"},
		{"release", []string{"REGISTRY=r.io/x$$(touch " + mark + ")"}, "REGISTRY holds a $"},
		{"publish", []string{"REGISTRY=r.io/x'; touch " + mark + "; echo '"}, "is not a registry and path"},
		{"publish", []string{`REGISTRY=r.io/x"; touch ` + mark + `; echo "`}, "is not a registry and path"},
		{"release", []string{"REGISTRY="}, "say where the release is published"},
		{"release", []string{"REGISTRY=r.io/x", "VERSION=1.2"}, "is not a semantic version"},
		{"publish", []string{"REGISTRY=r.io/x", "VERSION=0.4.0; touch " + mark}, "is not a semantic version"},
		// Paths that do not exist: a check that let one pass would empty nothing.
		{"release", []string{"REGISTRY=r.io/x", "DIST=/nonexistent/student-controller-dist"}, "dist or a folder below it"},
		{"release", []string{"REGISTRY=r.io/x", "DIST=dist/../nonexistent-student-controller-dist"}, "dist or a folder below it"},
		{"release", []string{"REGISTRY=r.io/x", "REVISION=`touch " + mark + "`"}, "is not a commit hash"},
		// make would expand a $ itself, before any recipe line runs.
		{"release", []string{"REGISTRY=r.io/$(shell touch " + mark + ")"}, "REGISTRY holds a $"},
		{"publish", []string{"REGISTRY=r.io/x", "VERSION=$(shell touch " + mark + ")"}, "VERSION holds a $"},
		// The checked value is the one the recipes use.
		{"release", []string{"REGISTRY=r.io/x`touch " + mark + "`", "RELEASE_REGISTRY=r.io/x"}, "is not a registry and path"},
	} {
		cmd := exec.CommandContext(t.Context(), "make", append([]string{"--no-print-directory", "-C", root, c.target}, c.vars...)...)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("make %s %q: %v\n%s\nwant it refused: %q", c.target, c.vars, err, out, c.want)
		}
		if _, err := os.Stat(mark); err == nil {
			t.Fatalf("make %s %q ran the command it was given", c.target, c.vars)
		}
	}

	// From the environment too.
	cmd := exec.CommandContext(t.Context(), "make", "--no-print-directory", "-C", root, "release")
	cmd.Env = append(os.Environ(), "REGISTRY=r.io/$(shell touch "+mark+")")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "REGISTRY holds a $") {
		t.Errorf("make release with REGISTRY in the environment holding $(shell ...): %v\n%s\nwant it refused", err, out)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("make release ran the $(shell ...) of REGISTRY in the environment")
	}

	// A tree with a change, or a new file: refused (a copy of the check, in a repository
	// of its own).
	repo := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), "git", append([]string{"-C", repo, "-c", "user.email=t@example.com", "-c", "user.name=t"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %q: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	if err := os.WriteFile(filepath.Join(repo, "main.go"), []byte("package main\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	git("add", ".")
	git("commit", "-q", "-m", "one")
	check := func() (string, error) {
		cmd := exec.CommandContext(t.Context(), filepath.Join(root, "hack", "release-check.sh"), "release")
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "RELEASE_REGISTRY=r.io/x", "RELEASE_VERSION=0.4.0", "RELEASE_DIST=dist",
			"RELEASE_REVISION=0123456789abcdef0123456789abcdef01234567")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := check(); err != nil {
		t.Fatalf("a clean tree: %v\n%s", err, out)
	}
	for _, change := range []string{"main.go", "new.go"} {
		if err := os.WriteFile(filepath.Join(repo, change), []byte("package main\n\nvar x int\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := check(); err == nil || !strings.Contains(out, "the tree has changes") {
			t.Errorf("a tree with %s changed: %v\n%s\nwant it refused", change, err, out)
		}
		git("checkout", "-q", "--", ".")
		git("clean", "-q", "-f")
	}
}
