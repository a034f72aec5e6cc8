package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestOneVersion: the binary (the Makefile stamps the VERSION file's), the image (the
// same variable), the chart and the changelog's newest entry name one version; the
// license is Apache-2.0, and the chart names it.
func TestOneVersion(t *testing.T) {
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path) // #nosec G304 -- files of this repository
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	version := strings.TrimSpace(read("../../VERSION"))
	if !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(version) {
		t.Fatalf("VERSION holds %q, want MAJOR.MINOR.PATCH", version)
	}
	if !strings.Contains(read("../../Makefile"), "VERSION ?= $(shell cat VERSION)") {
		t.Error("the Makefile does not stamp the binary and the image with the VERSION file's version")
	}
	chart := read("../../charts/student-controller/Chart.yaml")
	// The license: Apache-2.0, in LICENSE, and named by the chart (the image's label
	// is hack/tools/image's).
	if license := read("../../LICENSE"); !strings.Contains(license, "Apache License\n                           Version 2.0, January 2004") {
		t.Error("LICENSE is not the Apache License 2.0")
	}
	if !strings.Contains(chart, "artifacthub.io/license: Apache-2.0") {
		t.Error("Chart.yaml does not name the license (annotation artifacthub.io/license)")
	}
	for _, field := range []string{"version: " + version, `appVersion: "` + version + `"`} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(field) + `$`).MatchString(chart) {
			t.Errorf("Chart.yaml lacks %q", field)
		}
	}
	// Keep a Changelog: "## [X.Y.Z] - DATE", then the schema it brings.
	newest := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}\n\nRegistry schema (\d+)\.$`).FindStringSubmatch(read("../../CHANGELOG.md"))
	if newest == nil || newest[1] != version {
		t.Errorf("CHANGELOG.md's newest entry is %v, want version %s, dated, with the schema it brings", newest, version)
	}
	migrations, err := os.ReadDir("../../internal/registry/migrations/sqlite")
	if err != nil {
		t.Fatal(err)
	}
	latest := strings.SplitN(migrations[len(migrations)-1].Name(), "_", 2)[0]
	if newest != nil && strings.TrimLeft(latest, "0") != newest[2] {
		t.Errorf("CHANGELOG.md says version %s brings schema %s; the newest migration is %s", version, newest[2], latest)
	}
}
