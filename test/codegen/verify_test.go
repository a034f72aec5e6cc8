// Package codegen checks that hack/verify-codegen.sh catches stale generated code.
package codegen

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/student-controller/student-controller/internal/testenv"
)

// TestVerifyCodegenCatchesStaleTypes adds a field to the API types in a copy of the
// tree without regenerating, and expects hack/verify-codegen.sh to fail and to name
// what is stale. (`make verify` shows the other half: the script passes on main.)
func TestVerifyCodegenCatchesStaleTypes(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	copyTree := exec.Command("bash", "-c",
		`tar -C "$1" --exclude=./.git --exclude=./bin --exclude=./.local -cf - . | tar -C "$2" -xf -`, "copy", root, tree)
	if out, err := copyTree.CombinedOutput(); err != nil {
		t.Fatalf("copy tree: %v\n%s", err, out)
	}

	types := filepath.Join(tree, "pkg", "apis", "bolingcavalry", "v1", "types.go")
	src, err := os.ReadFile(types)
	if err != nil {
		t.Fatal(err)
	}
	const anchor = "type StudentSpec struct {\n"
	if !strings.Contains(string(src), anchor) {
		t.Fatalf("%s has no %q to add a field to", types, anchor)
	}
	added := strings.Replace(string(src), anchor, anchor+
		"\t// Grade is the school year.\n\t// +optional\n\tGrade *int32 `json:\"grade,omitempty\"`\n\n", 1)
	if err := os.WriteFile(types, []byte(added), 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(tree, "hack", "verify-codegen.sh")).CombinedOutput()
	if err == nil {
		t.Fatalf("verify-codegen.sh passed after a field was added without regenerating:\n%s", out)
	}
	if ctx.Err() != nil {
		t.Fatalf("verify-codegen.sh timed out:\n%s", out)
	}
	for _, want := range []string{
		"Generated code is stale",
		"zz_generated.deepcopy.go",            // deepcopy of the new pointer field
		"applyconfiguration/bolingcavalry/v1", // WithGrade
		"bolingcavalry.k8s.io_students.yaml",  // the CRD schema
		"+              grade:",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("verify-codegen.sh output lacks %q:\n%s", want, out)
		}
	}
}
