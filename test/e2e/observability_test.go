package e2e

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv"
)

// TestReadinessAndMetrics: /readyz says not ready until the Student cache has synced
// (here: until the controller is granted its RBAC), then ready; /metrics serves the
// controller's, workqueue and client metrics.
func TestReadinessAndMetrics(t *testing.T) {
	ctx := context.Background()
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	path := filepath.Join(t.TempDir(), "registry.db")
	late, err := env.ServiceAccount(ctx, systemNamespace, "late-bound")
	if err != nil {
		t.Fatal(err)
	}
	pprofAddr := testenv.Addr(t)
	p := startProcess(t, "controller", "--kubeconfig", late.Kubeconfig, "--namespace", ns,
		"--registry", "sqlite://"+path, "--registry-owner", owner, "--pprof-bind-address", pprofAddr)

	// Without RBAC the cache cannot sync: alive, not ready.
	waitFor(t, 30*time.Second, "the probe server", func() bool {
		code, _, _ := get("http://" + p.ProbeAddr + "/healthz")
		return code == 200
	})
	for range 5 {
		code, body, err := get("http://" + p.ProbeAddr + "/readyz")
		if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "the Student cache has not synced") {
			t.Fatalf("/readyz before the cache can sync: %d %q %v", code, body, err)
		}
		time.Sleep(300 * time.Millisecond)
	}

	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "late-bound-student-controller"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "student-controller"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "late-bound", Namespace: systemNamespace}},
	}
	if _, err := kubeClient().RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kubeClient().RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	waitFor(t, 90*time.Second, "/readyz to flip to ready", func() bool {
		code, _, _ := get("http://" + p.ProbeAddr + "/readyz")
		return code == 200
	})

	createMany(t, ns, 3, "m")
	waitAllReady(t, ns, 3, time.Minute)
	// A sync is counted once it returns, just after its status write: a Student can
	// show Ready a moment before its sync is counted, so wait for the count.
	success := func(labels string) bool { return labels == `result="success"` }
	var body string
	waitFor(t, 30*time.Second, "/metrics to count 3 successful syncs", func() bool {
		_, b, err := get("http://" + p.MetricsAddr + "/metrics")
		body = b
		return err == nil && testenv.MetricSum(b, "student_controller_reconcile_total", success) >= 3
	})
	for _, want := range []string{
		`student_controller_reconcile_duration_seconds_bucket{result="success"`,
		// A new Student's row is inserted, with no read first.
		`student_controller_registry_operation_duration_seconds_count{operation="insert",result="ok"} 3`,
		`student_controller_registry_rows_written_total{action="created"} 3`,
		`student_controller_sweep_duration_seconds_count `,
		`workqueue_depth{name="student-controller"}`,
		`workqueue_adds_total{name="student-controller"}`,
		`workqueue_work_duration_seconds_count{name="student-controller"}`,
		`rest_client_requests_total{`,
		`process_resident_memory_bytes `,
		`go_goroutines `,
		// The collector target main sets when the environment gives none.
		fmt.Sprintf("go_gc_gogc_percent %s\n", cmp.Or(os.Getenv("GOGC"), "50")),
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// The sweep outcomes are exported at 0 from the start: their sum says whether
	// the first sweep was counted.
	if n := testenv.MetricSum(body, "student_controller_sweep_total", nil); n < 1 {
		t.Errorf("/metrics counts %v sweeps, want at least the first one", n)
	}

	// Profiles only where --pprof-bind-address says, not beside the probes; with it
	// set the heap is sampled (without it the controller turns sampling off).
	code, body, err := get("http://" + pprofAddr + "/debug/pprof/heap?debug=1")
	if err != nil || code != http.StatusOK || !strings.Contains(body, "heap profile") {
		t.Errorf("pprof heap profile: %d %.80q %v", code, body, err)
	}
	// The header ends "@ heap/" and twice the sampling rate; 0 is not sampled.
	if header, _, _ := strings.Cut(body, "\n"); !strings.Contains(header, "@ heap/") || strings.HasSuffix(header, "@ heap/0") {
		t.Errorf("the heap profile is not sampled: %q", header)
	}
	if code, _, _ := get("http://" + p.ProbeAddr + "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("the probe server answers /debug/pprof/ with %d, want 404", code)
	}
}

// TestSecureMetrics: with --metrics-secure, /metrics answers only callers that the API
// server authenticates and authorizes, as in the Deployment.
func TestSecureMetrics(t *testing.T) {
	ctx := context.Background()
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	dir := t.TempDir()
	p := startProcess(t, "controller", "--kubeconfig", controllerID.Kubeconfig, "--namespace", ns,
		"--registry", "sqlite://"+filepath.Join(dir, "registry.db"), "--metrics-secure")

	scraper, err := env.ServiceAccount(ctx, systemNamespace, "prometheus")
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := env.ServiceAccount(ctx, systemNamespace, "stranger")
	if err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-student-controller-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "student-controller-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: systemNamespace}},
	}
	if _, err := kubeClient().RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kubeClient().RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})

	// The certificate is self-signed; what is tested here is who may read.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 10 * time.Second}
	scrape := func(token string) (int, string) {
		return testenv.ScrapeAs(client, "https://"+p.MetricsAddr+"/metrics", token)
	}
	waitFor(t, 30*time.Second, "the metrics server", func() bool {
		code, _ := scrape("")
		return code != 0
	})
	if code, _ := scrape(""); code != http.StatusUnauthorized {
		t.Errorf("no token: status %d, want 401", code)
	}
	if code, _ := scrape("not-a-token"); code != http.StatusUnauthorized {
		t.Errorf("a bad token: status %d, want 401", code)
	}
	if code, _ := scrape(stranger.Config.BearerToken); code != http.StatusForbidden {
		t.Errorf("a ServiceAccount without the metrics-reader role: status %d, want 403", code)
	}
	code, body := scrape(scraper.Config.BearerToken)
	if code != http.StatusOK || !strings.Contains(body, "workqueue_depth") {
		t.Errorf("the metrics reader: status %d, body %.200q", code, body)
	}
}
