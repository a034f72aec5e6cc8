package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2/ktesting"

	"github.com/student-controller/student-controller/internal/controller"
)

// TestChartScope: watchNamespace and watchSelector become the controller's --namespace
// and --selector and the admission policy binding's namespace and object selectors,
// and the two pick the same Students.
func TestChartScope(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`
watchNamespace: "school-b, school-a,school-b"
watchSelector:
  matchLabels: {team: blue}
  matchExpressions:
    - {key: tier, operator: In, values: [gold, silver]}
    - {key: retired, operator: DoesNotExist}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out := helm(ctx, t, "template", chartRelease, chartDir, "--namespace", chartNS, "--kube-version", kubeVersion, "--values", values)
	var d appsv1.Deployment
	var binding admissionregistrationv1.MutatingAdmissionPolicyBinding
	forEachObject(t, []byte(out), func(kind string, decode func(into any)) {
		switch kind {
		case "Deployment":
			decode(&d)
		case "MutatingAdmissionPolicyBinding":
			decode(&binding)
		}
	})
	flags := map[string]string{}
	for _, arg := range d.Spec.Template.Spec.Containers[0].Args {
		if name, value, ok := strings.Cut(strings.TrimPrefix(arg, "--"), "="); ok {
			flags[name] = value
		}
	}
	if got, want := flags["namespace"], "school-a,school-b"; got != want {
		t.Errorf("--namespace=%q, want %q", got, want)
	}
	scope, err := controller.ParseScope(flags["namespace"], flags["selector"])
	if err != nil {
		t.Fatalf("the controller refuses the chart's --namespace=%q --selector=%q: %v", flags["namespace"], flags["selector"], err)
	}
	if binding.Spec.MatchResources == nil || binding.Spec.MatchResources.NamespaceSelector == nil || binding.Spec.MatchResources.ObjectSelector == nil {
		t.Fatalf("the binding has no namespace and object selectors: %+v", binding.Spec)
	}
	namespaces, err := metav1.LabelSelectorAsSelector(binding.Spec.MatchResources.NamespaceSelector)
	if err != nil {
		t.Fatal(err)
	}
	objects, err := metav1.LabelSelectorAsSelector(binding.Spec.MatchResources.ObjectSelector)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"school-a", "school-b", "school-c", "default"} {
		policy := namespaces.Matches(labels.Set{"kubernetes.io/metadata.name": ns})
		if policy != scope.Contains(ns) || policy != slices.Contains([]string{"school-a", "school-b"}, ns) {
			t.Errorf("namespace %s: the policy binds it %v, the controller watches it %v", ns, policy, scope.Contains(ns))
		}
	}
	for _, set := range []labels.Set{
		{"team": "blue", "tier": "gold"}, {"team": "blue", "tier": "silver"}, {"team": "blue", "tier": "bronze"},
		{"team": "red", "tier": "gold"}, {"team": "blue"}, {"team": "blue", "tier": "gold", "retired": ""}, {},
	} {
		if policy, watched := objects.Matches(set), scope.Selector.Matches(set); policy != watched {
			t.Errorf("labels %v: the policy matches them %v, the controller's --selector=%q %v", set, policy, flags["selector"], watched)
		}
	}
	if !scope.Selector.Matches(labels.Set{"team": "blue", "tier": "gold"}) {
		t.Errorf("--selector=%q does not match team=blue,tier=gold", flags["selector"])
	}

	// The list form, as helm --set writes it.
	out = helm(ctx, t, "template", chartRelease, chartDir, "--namespace", chartNS, "--kube-version", kubeVersion,
		"--set", "watchNamespace={school-b,school-a}")
	if !strings.Contains(out, "- --namespace=school-a,school-b\n") {
		t.Errorf("watchNamespace={school-b,school-a} renders no --namespace=school-a,school-b:\n%s", out)
	}
}
