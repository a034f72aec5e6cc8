package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestLinksNoTemplates checks that the controller, built as make builds it, links no
// template engine that is reachable. golang.org/x/net/trace (grpc's, unless built with
// -tags=grpcnotrace) serves pages through html/template, which can call any method by
// name: while it is linked, the linker keeps every exported method of every type, and
// the binary grew from 62 to 90 MB, its resident memory by 17 MiB. text/template stays
// linked through cobra (component-base's flags) without being reachable.
func TestLinksNoTemplates(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, pkg := range []string{"golang.org/x/net/trace", "html/template"} {
		if slices.Contains(deps, pkg) {
			t.Errorf("the controller links %s (GOFLAGS=%q): build it with -tags=grpcnotrace, as the Makefile's GOFLAGS has it; "+
				"if another package brought it in, leave that package out", pkg, os.Getenv("GOFLAGS"))
		}
	}
}
