package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/student-controller/student-controller/internal/testenv"
)

// TestMetricsNamedByAlertsAndDashboard: every metric that the chart's alerts and
// Grafana dashboard query exists on a running controller (leader election on, a
// Student synced, a sweep done), so that no alert or panel watches a name that is
// never exported.
func TestMetricsNamedByAlertsAndDashboard(t *testing.T) {
	files := filepath.Join(env.Root, "charts", "student-controller", "files")
	var exprs []string
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	data, err := os.ReadFile(filepath.Join(files, "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sigsyaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	var dashboard struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if data, err = os.ReadFile(filepath.Join(files, "dashboard.json")); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &dashboard); err != nil {
		t.Fatal(err)
	}
	for _, p := range dashboard.Panels {
		for _, target := range p.Targets {
			exprs = append(exprs, target.Expr)
		}
	}
	names := metricNames(exprs)
	if len(names) < 10 {
		t.Fatalf("found only %v in %d expressions: the parsing is off", names, len(exprs))
	}

	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	leaseRBAC(t, ns)
	p := startProcess(t, "controller", "--kubeconfig", controllerID.Kubeconfig, "--namespace", ns,
		"--registry", "sqlite://"+filepath.Join(t.TempDir(), "registry.db"), "--registry-owner", owner,
		"--leader-elect", "--sqlite-shared-file", "--leader-elect-namespace", ns,
		"--sweep-interval", "1s")
	if _, err := students(ns).Create(context.Background(), newStudent("zhang-san", "深圳中学", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAllReady(t, ns, 1, time.Minute)
	var missing []string
	eventually(t, 30*time.Second, "every metric the alerts and the dashboard name", func(context.Context) (bool, error) {
		_, body, err := get("http://" + p.MetricsAddr + "/metrics")
		if err != nil {
			return false, nil
		}
		missing = missing[:0]
		for _, name := range names {
			if len(metricLines(body, name)) == 0 {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0, nil
	})
	if len(missing) > 0 {
		t.Errorf("not exported: %v", missing)
	}
	t.Logf("%d metrics named, all exported: %v", len(names), names)
}

// metricNames picks the metric names out of PromQL expressions: what is left once label
// matchers, ranges, grouping clauses, numbers and the language's own words are gone.
func metricNames(exprs []string) []string {
	strip := regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]|\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)|"[^"]*"`)
	word := regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promql := map[string]bool{
		"sum": true, "max": true, "min": true, "avg": true, "count": true, "rate": true, "increase": true, "irate": true,
		"histogram_quantile": true, "or": true, "and": true, "unless": true, "vector": true, "absent": true, "bool": true,
	}
	var names []string
	for _, e := range exprs {
		for _, w := range word.FindAllString(strip.ReplaceAllString(e, " "), -1) {
			if !promql[w] && !slices.Contains(names, w) && strings.Contains(w, "_") {
				names = append(names, w)
			}
		}
	}
	slices.Sort(names)
	return names
}
