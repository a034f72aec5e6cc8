package v1

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// The spec's rules. The CRD's markers on StudentSpec say them to the API server (a
// marker cannot name a constant); Validate says them to the controller, for Students
// stored before the CRD had them or written past it. TestSpecRulesMatchTheCRD holds
// the two to one definition: these constants, checked against the generated CRD.
const (
	// NameMaxLength and SchoolMaxLength are the longest spec.name and spec.school, in
	// characters; both must hold at least one.
	NameMaxLength   = 128
	SchoolMaxLength = 256

	// RuleNotBlank and RuleNoControl are the CEL rules of spec.name and spec.school,
	// and MessageBlank and MessageControl what the API server says when one fails.
	RuleNotBlank   = "self.trim().size() > 0"
	MessageBlank   = "must not be blank"
	RuleNoControl  = "!self.matches('[[:cntrl:]]')"
	MessageControl = "must not hold control characters (U+0000 to U+001F, U+007F)"
)

// DeletionPolicies are the values spec.deletionPolicy takes (the CRD's enum); empty
// means the default, Delete.
var DeletionPolicies = []DeletionPolicy{DeletionPolicyDelete, DeletionPolicyOrphan}

// Managements are the values spec.management takes (the CRD's enum); empty means the
// default, Manage.
var Managements = []Management{ManagementManage, ManagementObserve}

// Validate says what is wrong with the spec by the CRD's rules, or "" when nothing is.
func (spec StudentSpec) Validate() string {
	if problem := validateText("spec.name", spec.Name, NameMaxLength); problem != "" {
		return problem
	}
	if problem := validateText("spec.school", spec.School, SchoolMaxLength); problem != "" {
		return problem
	}
	if spec.DeletionPolicy != "" && spec.DeletionPolicy != DeletionPolicyDelete && spec.DeletionPolicy != DeletionPolicyOrphan {
		return fmt.Sprintf("spec.deletionPolicy %q is neither Delete nor Orphan", spec.DeletionPolicy)
	}
	if spec.Management != "" && !slices.Contains(Managements, spec.Management) {
		return fmt.Sprintf("spec.management %q is neither Manage nor Observe", spec.Management)
	}
	return ""
}

// validateText applies a text field's rules: at least one character, at most max, not
// blank (RuleNotBlank: CEL's trim() takes Unicode white space, as strings.TrimSpace
// does), no control characters (RuleNoControl: POSIX [[:cntrl:]] in RE2 is U+0000 to
// U+001F and U+007F; PostgreSQL's TEXT cannot hold NUL, and the others show as nothing).
func validateText(field, s string, max int) string {
	switch n := utf8.RuneCountInString(s); {
	case n == 0 || strings.TrimSpace(s) == "":
		return field + " must not be empty or blank"
	case n > max:
		return fmt.Sprintf("%s is %d characters long, more than %d", field, n, max)
	case strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return field + " " + MessageControl
	}
	return ""
}
