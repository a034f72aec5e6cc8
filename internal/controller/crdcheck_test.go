package controller

import (
	"os"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	sigsyaml "sigs.k8s.io/yaml"
)

func readCRD(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(path) // #nosec G304 -- the test's own files
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := sigsyaml.Unmarshal(b, &obj); err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: obj}
}

// TestMissingFields: this version's CRD has every field the controller relies on;
// 0.2.0's lacks spec.management, which the check names.
func TestMissingFields(t *testing.T) {
	if missing := MissingFields(readCRD(t, "../../config/crd/bases/bolingcavalry.k8s.io_students.yaml")); len(missing) != 0 {
		t.Errorf("this version's CRD lacks %v", missing)
	}
	if missing := MissingFields(readCRD(t, "testdata/crd-0.2.0.yaml")); !slices.Equal(missing, []string{"spec.management"}) {
		t.Errorf("0.2.0's CRD lacks %v, want [spec.management]", missing)
	}
	if missing := MissingFields(&unstructured.Unstructured{Object: map[string]any{}}); len(missing) != len(RequiredFields) {
		t.Errorf("no schema at all: %d missing, want all %d", len(missing), len(RequiredFields))
	}
}
