package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRootAbove: a -trimpath test binary finds the repository from its package's folder,
// past the go.mod of a module of its own (hack/tools has such modules), and says so
// when there is none.
func TestRootAbove(t *testing.T) {
	root := t.TempDir()
	write := func(dir, module string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("// a comment\nmodule \""+module+"\" // quoted\n\ngo 1.26.0\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(root, modulePath)
	tool := filepath.Join(root, "hack", "tools", "image")
	write(tool, modulePath+"/hack/tools/image")
	pkg := filepath.Join(tool, "internal")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{root, tool, pkg} {
		if got, err := rootAbove(dir); err != nil || got != root {
			t.Errorf("rootAbove(%s) = %q, %v; want %q", dir, got, err, root)
		}
	}
	if got, err := rootAbove(t.TempDir()); err == nil {
		t.Errorf("rootAbove of a folder outside the repository = %q, want an error", got)
	}
}
