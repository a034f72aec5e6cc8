package ctrlbin

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/student-controller/student-controller/internal/testenv"
)

// TestShippedTags checks that the tests build the controller with the tags the
// Makefile builds it with.
func TestShippedTags(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^GO_TAGS := (.*)$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile sets no GO_TAGS")
	}
	if string(m[1]) != ShippedTags {
		t.Errorf("the Makefile builds with tags %q, the tests with %q (ShippedTags)", m[1], ShippedTags)
	}
}
