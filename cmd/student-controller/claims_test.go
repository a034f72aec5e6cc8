package main

import (
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
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
	// A relative link, with its anchor if any.
	docLink = regexp.MustCompile(`\]\(([^)#\s]*)(#[^)\s]*)?\)`)
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
var outsideFlags = map[string]bool{"--set": true, "--wait": true, "--take-ownership": true,
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
			target, anchor := m[1], strings.TrimPrefix(m[2], "#")
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
