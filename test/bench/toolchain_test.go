package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// The bench builds its contenders with go.mod's toolchain: the Go the Makefile pins
// for make bench and the release.
func TestPinnedToolchainIsTheMakefiles(t *testing.T) {
	got, err := pinnedToolchain("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^GOTOOLCHAIN \?= (\S+)$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile has no GOTOOLCHAIN ?= line")
	}
	if got != string(m[1]) {
		t.Errorf("go.mod pins %s, the Makefile %s", got, m[1])
	}

	gomod := filepath.Join(t.TempDir(), "go.mod")
	if err := os.WriteFile(gomod, []byte("module example.com/x\n\ngo 1.26.0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := pinnedToolchain(gomod); err == nil {
		t.Error("pinnedToolchain took a go.mod without a toolchain line")
	}
}
