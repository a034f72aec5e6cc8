package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestOneVersion: the binary (the Makefile stamps the VERSION file's), the image (the
// same variable), the chart and the changelog's newest entry name one version.
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
	for _, field := range []string{"version: " + version, `appVersion: "` + version + `"`} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(field) + `$`).MatchString(chart) {
			t.Errorf("Chart.yaml lacks %q", field)
		}
	}
	newest := regexp.MustCompile(`(?m)^## (\S+) \(registry schema (\d+)\)$`).FindStringSubmatch(read("../../CHANGELOG.md"))
	if newest == nil || newest[1] != version {
		t.Errorf("CHANGELOG.md's newest entry is %v, want version %s with the schema it brings", newest, version)
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
