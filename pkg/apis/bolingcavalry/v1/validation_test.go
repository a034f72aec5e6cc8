package v1

import (
	"os"
	"slices"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// TestSpecRulesMatchTheCRD: the CRD that the markers generate says the rules that
// Validate applies, from the same constants: the lengths, the CEL rules and their
// messages, the deletion policies. (FuzzValidateSpec, in test/e2e, asks a real API
// server the same of random specs.)
func TestSpecRulesMatchTheCRD(t *testing.T) {
	data, err := os.ReadFile("../../../../config/crd/bases/bolingcavalry.k8s.io_students.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	if len(crd.Spec.Versions) != 1 {
		t.Fatalf("the CRD has %d versions, want 1", len(crd.Spec.Versions))
	}
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	for field, max := range map[string]int64{"name": NameMaxLength, "school": SchoolMaxLength} {
		p := spec.Properties[field]
		if p.MinLength == nil || *p.MinLength != 1 || p.MaxLength == nil || *p.MaxLength != max {
			t.Errorf("spec.%s: minLength %v, maxLength %v; want 1 and %d", field, p.MinLength, p.MaxLength, max)
		}
		var rules [][2]string
		for _, r := range p.XValidations {
			rules = append(rules, [2]string{r.Rule, r.Message})
		}
		want := [][2]string{{RuleNotBlank, MessageBlank}, {RuleNoControl, MessageControl}}
		if !slices.Equal(rules, want) {
			t.Errorf("spec.%s's rules: %q, want %q", field, rules, want)
		}
		if !slices.Contains(spec.Required, field) {
			t.Errorf("spec.%s is not required", field)
		}
	}
	var enum []DeletionPolicy
	for _, v := range spec.Properties["deletionPolicy"].Enum {
		enum = append(enum, DeletionPolicy(string(v.Raw[1:len(v.Raw)-1])))
	}
	if !slices.Equal(enum, DeletionPolicies) {
		t.Errorf("spec.deletionPolicy's enum: %q, want %q", enum, DeletionPolicies)
	}
	var managements []Management
	for _, v := range spec.Properties["management"].Enum {
		managements = append(managements, Management(string(v.Raw[1:len(v.Raw)-1])))
	}
	if !slices.Equal(managements, Managements) {
		t.Errorf("spec.management's enum: %q, want %q", managements, Managements)
	}
}

// TestValidate: each rule refuses what it should, with the CRD's message, and a spec
// that keeps them all passes.
func TestValidate(t *testing.T) {
	long := func(n int) string { return string(slices.Repeat([]rune{'张'}, n)) }
	for _, tc := range []struct {
		spec StudentSpec
		want string
	}{
		{StudentSpec{Name: "张三", School: "深圳中学"}, ""},
		{StudentSpec{Name: long(NameMaxLength), School: long(SchoolMaxLength), DeletionPolicy: DeletionPolicyOrphan}, ""},
		{StudentSpec{Name: "", School: "s"}, "spec.name must not be empty or blank"},
		{StudentSpec{Name: " \u3000", School: "s"}, "spec.name must not be empty or blank"},
		{StudentSpec{Name: long(NameMaxLength + 1), School: "s"}, "spec.name is 129 characters long, more than 128"},
		{StudentSpec{Name: "a\x00b", School: "s"}, "spec.name " + MessageControl},
		{StudentSpec{Name: "n", School: "\t"}, "spec.school must not be empty or blank"},
		{StudentSpec{Name: "n", School: "a\x7fb"}, "spec.school " + MessageControl},
		{StudentSpec{Name: "n", School: long(SchoolMaxLength + 1)}, "spec.school is 257 characters long, more than 256"},
		{StudentSpec{Name: "n", School: "s", DeletionPolicy: "Keep"}, `spec.deletionPolicy "Keep" is neither Delete nor Orphan`},
		{StudentSpec{Name: "n", School: "s", Management: ManagementObserve}, ""},
		{StudentSpec{Name: "n", School: "s", Management: "observe"}, `spec.management "observe" is neither Manage nor Observe`},
	} {
		if got := tc.spec.Validate(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.spec, got, tc.want)
		}
	}
}
