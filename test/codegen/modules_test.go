package codegen

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/mod/modfile"

	"github.com/student-controller/student-controller/internal/testenv"
)

// TestToolModulesFollowTheProduct: the modules of hack/tools (the control plane, Helm,
// promtool, gosec, the image builder) require every module they share with the product
// at the product's version, so that a build compiles client-go, apimachinery, grpc and
// the rest once for all of them (a cold CI run builds them all).
func TestToolModulesFollowTheProduct(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	product := versions(t, filepath.Join(root, "go.mod"))
	for tool, shared := range map[string]string{
		"hack/tools/controlplane": "k8s.io/client-go",
		"hack/tools/helm":         "k8s.io/client-go",
		"hack/tools/promtool":     "k8s.io/client-go",
		"hack/tools/gosec":        "golang.org/x/sys",
		"hack/tools/image":        "golang.org/x/sys",
	} {
		requires := versions(t, filepath.Join(root, tool, "go.mod"))
		if _, ok := requires[shared]; !ok {
			t.Errorf("%s no longer requires %s: this test checks nothing of it", tool, shared)
		}
		for path, version := range requires {
			if want, ok := product[path]; ok && version != want {
				t.Errorf("%s requires %s %s, the product %s: run `go get %s@%s` there (or move the product)",
					tool, path, version, want, path, want)
			}
		}
	}
}

// versions is the version of each module a go.mod requires, after its replace
// directives (the control plane's module requires Kubernetes' staging modules at
// v0.0.0 and replaces them with a release).
func versions(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path) // #nosec G304 -- a go.mod of this repository
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse(path, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range f.Require {
		out[r.Mod.Path] = r.Mod.Version
	}
	for _, r := range f.Replace {
		if _, ok := out[r.Old.Path]; ok && r.New.Path == r.Old.Path && r.New.Version != "" && (r.Old.Version == "" || r.Old.Version == out[r.Old.Path]) {
			out[r.Old.Path] = r.New.Version
		}
	}
	return out
}
