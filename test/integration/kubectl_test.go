package integration

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"
)

// kubectl runs the machine's kubectl against the test API server.
func kubectl(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", env.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestKubectl: what a user sees with kubectl: the classic manifest applies, `get stu`
// shows the printer columns, and `explain` shows the field docs.
func TestKubectl(t *testing.T) {
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Fatalf("kubectl is needed for this test and is not on PATH: %v", err)
	}
	_, ctx := ktesting.NewTestContext(t)
	c := newClients(t)

	// The sample names namespace default, as the classic manifest did.
	out := kubectl(ctx, t, "apply", "-f", filepath.Join(env.Root, "config", "samples", "zhang-san.yaml"))
	if !strings.Contains(out, "student.bolingcavalry.k8s.io/zhang-san created") {
		t.Errorf("kubectl apply said %q", out)
	}
	t.Cleanup(func() {
		_ = c.student.BolingcavalryV1().Students("default").Delete(context.Background(), "zhang-san", metav1.DeleteOptions{})
	})

	columns := func(header string) []string { return regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(header), -1) }
	for _, tc := range []struct {
		args        []string
		wantColumns []string
	}{
		{[]string{"get", "stu", "-n", "default"}, []string{"NAME", "DISPLAY NAME", "SCHOOL", "READY", "AGE"}},
		{[]string{"get", "students.bolingcavalry.k8s.io", "-n", "default"}, []string{"NAME", "DISPLAY NAME", "SCHOOL", "READY", "AGE"}},
		{[]string{"get", "school", "-n", "default"}, []string{"NAME", "DISPLAY NAME", "SCHOOL", "READY", "AGE"}},
		{[]string{"get", "stu", "-n", "default", "-o", "wide"}, []string{"NAME", "DISPLAY NAME", "SCHOOL", "READY", "REASON", "POLICY", "MANAGEMENT", "DRIFTED", "SYNC", "LAST WRITTEN", "AGE"}},
	} {
		out := kubectl(ctx, t, tc.args...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 {
			t.Errorf("kubectl %s: want a header and one row, got:\n%s", strings.Join(tc.args, " "), out)
			continue
		}
		if got := columns(lines[0]); strings.Join(got, "|") != strings.Join(tc.wantColumns, "|") {
			t.Errorf("kubectl %s: columns %q, want %q", strings.Join(tc.args, " "), got, tc.wantColumns)
		}
		row := lines[1]
		for _, cell := range []string{"zhang-san", "张三", "深圳中学"} {
			if !strings.Contains(row, cell) {
				t.Errorf("kubectl %s: row %q lacks %q", strings.Join(tc.args, " "), row, cell)
			}
		}
		if strings.Contains(strings.Join(tc.args, " "), "wide") && (!strings.Contains(row, "Delete") || !strings.Contains(row, "Manage")) {
			t.Errorf("kubectl get -o wide: row %q does not show the default deletionPolicy and management", row)
		}
	}

	// kubectl wraps descriptions to the terminal; compare with whitespace collapsed.
	flat := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	explain := flat(kubectl(ctx, t, "explain", "student.spec"))
	for _, want := range []string{
		"GROUP: bolingcavalry.k8s.io KIND: Student VERSION: v1",
		"Spec is the student as they should appear in the registry.",
		"name <string> -required- Name is the student's display name",
		"school <string> -required- School is the school the student attends",
		"deletionPolicy <string> enum: Delete, Orphan",
		"management <string> enum: Manage, Observe",
		"student's display name, in any script",
		"Orphan keeps it and releases it",
	} {
		if !strings.Contains(explain, want) {
			t.Errorf("kubectl explain student.spec lacks %q:\n%s", want, explain)
		}
	}
	explain = flat(kubectl(ctx, t, "explain", "stu.status"))
	for _, want := range []string{"observedGeneration <integer>", "conditions <[]Object>", "registry <Object>", "Ready summarises"} {
		if !strings.Contains(explain, want) {
			t.Errorf("kubectl explain stu.status lacks %q:\n%s", want, explain)
		}
	}
}
