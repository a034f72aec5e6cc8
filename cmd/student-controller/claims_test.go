package main

import (
	"context"
	"database/sql"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"

	"github.com/student-controller/student-controller/internal/registry"
)

// The pages in docs/ and the README name tests, metrics, alerts, condition reasons,
// flags, Helm values, Go files, make targets and other pages (and their headings); TestDocsNameWhatExists fails
// when one of those names is not in the code, so that a claim cannot outlive what it
// names.

// docPages are the pages whose claims are checked, from the repository's root.
func docPages(t *testing.T) map[string]string {
	t.Helper()
	pages := map[string]string{}
	paths, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range append(paths, "../../README.md") {
		b, err := os.ReadFile(path) // #nosec G304 -- the repository's own pages
		if err != nil {
			t.Fatal(err)
		}
		pages[path] = string(b)
	}
	return pages
}

// repoText is every file below the repository's root whose name ends in suffix, but
// for what git ignores here (bin/, .local/), concatenated.
func repoText(t *testing.T, suffix string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "bin" || d.Name() == ".local" || d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, suffix) {
			src, err := os.ReadFile(path) // #nosec G304 -- the repository's own files
			if err != nil {
				return err
			}
			b.Write(src)
			b.WriteByte('\n')
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

var (
	// A test named in a page: a Go identifier that starts with Test, in backticks.
	docTest = regexp.MustCompile("`(Test[A-Z][A-Za-z0-9_]*)`")
	// A metric of ours, its histogram suffixes aside.
	docMetric = regexp.MustCompile(`\b(student_controller_[a-z0-9_]+?)(_bucket|_count|_sum)?\b`)
	// A make target, in backticks.
	docMake = regexp.MustCompile("`make ([a-z][a-z-]*)")
	// A relative link, with its label and its anchor if any.
	docLink = regexp.MustCompile(`\[([^\]]*)\]\(([^)#\s]*)(#[^)\s]*)?\)`)
	// A reason of the Ready condition, as the pages write one.
	docReason = regexp.MustCompile("Ready=(?:False|True)`?/`?([A-Z][A-Za-z]+)")
	// A row of the alerts table: its alert.
	docAlertRow = regexp.MustCompile("(?m)^\\| `(Student[A-Za-z]+)` \\(")
	// An alert rule.
	alertRule = regexp.MustCompile(`(?m)^\s+- alert: (\S+)$`)
	// A flag, as a code span starts with it: ours, or one of outsideFlags.
	docFlag = regexp.MustCompile("`(--[a-z][a-z0-9-]*[a-z0-9])")
	// A Helm value (its path, before any =) or a Go file, in backticks.
	docDotted = regexp.MustCompile("`([a-z][A-Za-z0-9]*(?:\\.[A-Za-z][A-Za-z0-9]*)+)(?:=[^`]*)?`")
	// An Event reason the controller declares, and a row of design.md's Events table.
	codeEvent = regexp.MustCompile(`(?m)^\s+[eE]vent[A-Z][A-Za-z]*\s*=\s*"([A-Z][A-Za-z]+)"$`)
	// A heading, and a target of the Makefile.
	heading    = regexp.MustCompile(`(?m)^#+ (.+)$`)
	makeTarget = regexp.MustCompile(`(?m)^([a-z][a-z-]*):`)
)

// outsideFlags are flags of other programs that the pages show: helm's and
// kube-apiserver's.
var outsideFlags = map[string]bool{"--set": true, "--wait": true, "--take-ownership": true, "--reset-then-reuse-values": true,
	"--shutdown-watch-termination-grace-period": true, "--tracing-config-file": true}

func TestDocsNameWhatExists(t *testing.T) {
	pages := docPages(t)
	var opts options
	var rf registryFlags
	flags := flag.NewFlagSet("all", flag.ContinueOnError)
	opts.addCommandFlags(flags)
	rf.add(flags)
	addLoggingFlags(flags)
	valuesYAML, err := os.ReadFile("../../charts/student-controller/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := sigsyaml.Unmarshal(valuesYAML, &values); err != nil {
		t.Fatal(err)
	}
	goFiles := map[string]bool{}
	if err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			goFiles[d.Name()] = true
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	tests := repoText(t, "_test.go")
	code := repoText(t, ".go")
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range makeTarget.FindAllStringSubmatch(string(makefile), -1) {
		targets[m[1]] = true
	}
	alertsYAML, err := os.ReadFile("../../charts/student-controller/files/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	alerts := map[string]bool{}
	for _, m := range alertRule.FindAllStringSubmatch(string(alertsYAML), -1) {
		alerts[m[1]] = true
	}

	tabled := map[string]bool{}
	for path, text := range pages {
		page := strings.TrimPrefix(path, "../../")
		for _, m := range docTest.FindAllStringSubmatch(text, -1) {
			if !strings.Contains(tests, "func "+m[1]+"(") {
				t.Errorf("%s names the test %s, which no _test.go file has", page, m[1])
			}
		}
		for _, m := range docMetric.FindAllStringSubmatch(text, -1) {
			if !strings.Contains(code, `"`+m[1]+`"`) {
				t.Errorf("%s names the metric %s, which the code does not register", page, m[1])
			}
		}
		for _, m := range docReason.FindAllStringSubmatch(text, -1) {
			if !regexp.MustCompile(`Reason` + m[1] + `\s*=\s*"` + m[1] + `"`).MatchString(code) {
				t.Errorf("%s names the reason %s, which pkg/apis does not declare", page, m[1])
			}
		}
		for _, m := range docFlag.FindAllStringSubmatch(text, -1) {
			if flags.Lookup(strings.TrimPrefix(m[1], "--")) == nil && !outsideFlags[m[1]] {
				t.Errorf("%s names the flag %s, which neither the controller nor its registry subcommands have", page, m[1])
			}
		}
		for _, m := range docDotted.FindAllStringSubmatch(text, -1) {
			path := strings.Split(m[1], ".")
			switch {
			case strings.HasSuffix(m[1], ".go") && len(path) == 2:
				if !goFiles[m[1]] {
					t.Errorf("%s names the file %s, which the repository does not have", page, m[1])
				}
			case values[path[0]] != nil && !hasValue(values, path):
				t.Errorf("%s names the Helm value %s, which values.yaml does not have", page, m[1])
			}
		}
		for _, m := range docMake.FindAllStringSubmatch(text, -1) {
			if !targets[m[1]] {
				t.Errorf("%s names make %s, which the Makefile has no target for", page, m[1])
			}
		}
		for _, m := range docAlertRow.FindAllStringSubmatch(text, -1) {
			tabled[m[1]] = true
			if !alerts[m[1]] {
				t.Errorf("%s's alerts table names %s, which alerts.yaml does not have", page, m[1])
			}
		}
		for _, m := range docLink.FindAllStringSubmatch(text, -1) {
			target, anchor := m[2], strings.TrimPrefix(m[3], "#")
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file := path
			if target != "" {
				file = filepath.Join(filepath.Dir(path), target)
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s links to %s, which does not exist", page, target)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(file, ".md") && !hasAnchor(t, file, anchor) {
				t.Errorf("%s links to %s#%s, a heading that page does not have", page, target, anchor)
			}
			if named := pageNamed(m[1]); named != "" && named != filepath.Base(file) {
				t.Errorf("%s links [%s] to %s: the label names docs/%s", page, m[1], target, named)
			}
		}
	}
	for alert := range alerts {
		if !tabled[alert] {
			t.Errorf("alerts.yaml has %s, which no alerts table in docs/ lists", alert)
		}
		// Each alert's runbook: its section of docs/runbooks.md.
		url := runbookBase + strings.ToLower(alert)
		if !strings.Contains(string(alertsYAML), "runbook_url: "+url+"\n") {
			t.Errorf("alert %s has no runbook_url %s", alert, url)
		}
		if !hasAnchor(t, "../../docs/runbooks.md", strings.ToLower(alert)) {
			t.Errorf("docs/runbooks.md has no section for alert %s", alert)
		}
	}
	// Each Event the controller posts: a row of design.md's Events table.
	design := pages["../../docs/design.md"]
	for _, m := range codeEvent.FindAllStringSubmatch(code, -1) {
		if !regexp.MustCompile("(?m)^\\|.*\\| (?:Warning|Normal) `" + m[1] + "`").MatchString(design) {
			t.Errorf("docs/design.md's Events table has no row for the Event %s", m[1])
		}
	}
	// Each reason the controller reports: its section of docs/troubleshooting.md.
	for _, m := range apiReason.FindAllStringSubmatch(code, -1) {
		if !hasAnchor(t, "../../docs/troubleshooting.md", slug(m[1])) {
			t.Errorf("docs/troubleshooting.md has no section for the reason %s", m[1])
		}
	}
}

// pageNamed is the page of docs/ that a link's label names, or "" for a label that
// names none: "operating", "installing", "runbook" and "docs/flags.md" name a page;
// "traces" and "set its scope" do not.
func pageNamed(label string) string {
	label = strings.ToLower(strings.Trim(label, "`"))
	label = strings.TrimSuffix(strings.TrimPrefix(label, "docs/"), ".md")
	label = strings.ReplaceAll(label, " ", "-")
	stem := strings.TrimSuffix(label, "ing")
	for _, name := range []string{label, label + "s", strings.TrimSuffix(label, "s"), stem, stem + "e"} {
		if _, err := os.Stat("../../docs/" + name + ".md"); err == nil && name != "" {
			return name + ".md"
		}
	}
	return ""
}

// hasValue says whether the chart's values have the key path.
func hasValue(values map[string]any, path []string) bool {
	var v any = values
	for _, key := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		if v, ok = m[key]; !ok {
			return false
		}
	}
	return true
}

// runbookBase is where the alerts' runbook_url point: docs/runbooks.md, as the chart's
// home serves it.
const runbookBase = "https://github.com/student-controller/student-controller/blob/main/docs/runbooks.md#"

// apiReason is a reason the API declares.
var apiReason = regexp.MustCompile(`(?m)^\s+Reason[A-Za-z]+\s*=\s*"([A-Za-z]+)"$`)

// hasAnchor says whether the page at path has a heading whose anchor (as GitHub makes
// it) is anchor.
func hasAnchor(t *testing.T, path, anchor string) bool {
	t.Helper()
	b, err := os.ReadFile(path) // #nosec G304 -- the repository's own pages
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range heading.FindAllStringSubmatch(string(b), -1) {
		if slug(m[1]) == anchor {
			return true
		}
	}
	return false
}

// slug is a heading's anchor as GitHub makes it: lower case, spaces as hyphens, and
// but for letters, digits, hyphens and underscores nothing else.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDesignNamesTheSchema: docs/design.md's registry table has a row for each column of
// the students table, as the migrations leave it on SQLite, and names no other; the
// tables it lists beside it, as "`table` (`column`, ...)", have those columns.
func TestDesignNamesTheSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "registry.db")
	r, err := registry.Open(ctx, "sqlite://"+path, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	columns := func(table string) []string {
		rows, err := db.QueryContext(ctx, `SELECT name FROM pragma_table_info(?)`, table)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var names []string
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				t.Fatal(err)
			}
			names = append(names, name)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return names
	}

	design := docPages(t)["../../docs/design.md"]
	_, table, ok := strings.Cut(design, "## The registry table\n")
	if !ok {
		t.Fatal(`docs/design.md has no section "The registry table"`)
	}
	table, _, _ = strings.Cut(table, "\n\n**History.**")
	var tabled []string
	for _, m := range designColumnRow.FindAllStringSubmatch(table, -1) {
		for _, col := range strings.Split(m[1], ", ") {
			tabled = append(tabled, strings.Trim(col, "`"))
		}
	}
	only, missing := apart(tabled, columns("students"))
	for _, col := range only {
		t.Errorf("docs/design.md's registry table has a row for %s, which the students table does not have", col)
	}
	for _, col := range missing {
		t.Errorf("docs/design.md's registry table has no row for the students table's column %s", col)
	}
	listed := designTableList.FindAllStringSubmatch(table, -1)
	if len(listed) == 0 {
		t.Error("docs/design.md lists no table beside students as `table` (`column`, ...)")
	}
	for _, m := range listed {
		only, missing := apart(strings.Split(strings.ReplaceAll(m[2], "`", ""), ", "), columns(m[1]))
		if len(only)+len(missing) > 0 {
			t.Errorf("docs/design.md gives the table %s the columns %s; it has %v too and not %v", m[1], m[2], missing, only)
		}
	}
}

// apart is what of got is not in want, and what of want is not in got.
func apart(got, want []string) (only, missing []string) {
	for _, g := range got {
		if !slices.Contains(want, g) {
			only = append(only, g)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			missing = append(missing, w)
		}
	}
	return only, missing
}

var (
	// A row of design.md's registry table: its column cell.
	designColumnRow = regexp.MustCompile("(?m)^\\| (`[a-z_]+`(?:, `[a-z_]+`)*) \\|")
	// A table design.md lists with its columns: `table` (`column`, `column`).
	designTableList = regexp.MustCompile("`([a-z_]+)`\\s+\\(((?:`[a-z_]+`(?:,\\s+)?)+)\\)")
)
