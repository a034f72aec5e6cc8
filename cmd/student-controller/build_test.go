package main

import (
	"debug/elf"
	"path/filepath"
	"slices"
	"testing"

	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
)

// TestLinkerDropsUnusedMethods checks that the controller, built as it ships, leaves
// out the exported methods nothing calls. A reachable call of a method by name (a
// template engine's: golang.org/x/net/trace's html/template, linked through grpc
// unless built with -tags=grpcnotrace) makes the linker keep every exported method of
// every type it links: the binary grew from 62 to 90 MB that way. The probe is a
// method of the client-go clientset that the controller never calls.
func TestLinkerDropsUnusedMethods(t *testing.T) {
	bin, err := ctrlbin.Build{Out: filepath.Join(t.TempDir(), "student-controller")}.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	symbols, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	const probe = "k8s.io/client-go/kubernetes.(*Clientset).BatchV1"
	if slices.ContainsFunc(symbols, func(s elf.Symbol) bool { return s.Name == probe }) {
		t.Errorf("the controller (tags %q) links %s, which it never calls: something makes the linker keep every exported "+
			"method (a template engine or another call of a method by name; `go list -deps` shows what links html/template)",
			ctrlbin.ShippedTags, probe)
	}
}
