package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/otlptest"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// TestTracing: the controller started with --tracing-endpoint exports a trace for the
// sync of a new Student (its span with the Student's key, uid and generation, and its
// queue wait, registry and status spans as children), and kube-apiserver, whose own
// tracing exports to the same collector, continues it: its spans of the status write,
// down to the etcd transaction, are in the same trace.
func TestTracing(t *testing.T) {
	t.Parallel()
	collector := otlptest.Start(t)
	config := filepath.Join(t.TempDir(), "tracing.yaml")
	// Rate 0: kube-apiserver samples only the requests whose caller sampled.
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: TracingConfiguration
endpoint: %s
samplingRatePerMillion: 0
`, collector.Endpoint)), 0o600); err != nil {
		t.Fatal(err)
	}
	cp := controlplane.ForTest(t, controlplane.Options{WithoutControllerManager: true, APIServerFlags: map[string]string{"tracing-config-file": config}})
	url, _ := registrytest.SQLiteBackend().New(t)
	startProcess(t, "controller", "--kubeconfig", cp.Kubeconfig, "--registry", url, "--registry-owner", owner,
		"--tracing-endpoint", collector.Endpoint)
	ns := testenv.Namespace(t, kubernetes.NewForConfigOrDie(cp.Config), "trace-")
	client := versioned.NewForConfigOrDie(cp.Config).BolingcavalryV1().Students(ns)
	s, err := client.Create(context.Background(), newStudent("traced", "深圳中学", studentv1.DeletionPolicyDelete), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitAllReadyIn(t, client, 1, time.Minute)

	key := ns + "/traced"
	var sync otlptest.Span
	var trace []otlptest.Span
	// Spans are exported in batches (every 5 s by default).
	// The sync that wrote the row and the status (later ones, on the status' own
	// event, only read).
	found := func() bool {
		spans := collector.Spans()
		for _, sp := range spans {
			if sp.Service != controller.Name || sp.Name != controller.SpanSync || sp.Attributes[string(controller.AttrStudent)] != key {
				continue
			}
			trace = slices.DeleteFunc(slices.Clone(spans), func(other otlptest.Span) bool { return other.TraceID != sp.TraceID })
			if slices.ContainsFunc(trace, func(other otlptest.Span) bool { return other.Service == "apiserver" }) {
				sync = sp
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(30 * time.Second); !found(); time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			var got []string
			for _, sp := range collector.Spans() {
				got = append(got, fmt.Sprintf("%s %q trace %s %v", sp.Service, sp.Name, sp.TraceID, sp.Attributes))
			}
			t.Fatalf("no trace of the sync of %s with kube-apiserver's spans within 30 s; received:\n%s", key, strings.Join(got, "\n"))
		}
	}
	if got := sync.Attributes[string(controller.AttrResult)]; got != "success" {
		t.Errorf("the sync span's result: %q, want success", got)
	}
	if got := sync.Attributes[string(controller.AttrUID)]; got != string(s.UID) {
		t.Errorf("the sync span's uid: %q, want %q", got, s.UID)
	}
	if got := sync.Attributes[string(controller.AttrGeneration)]; got != "1" {
		t.Errorf("the sync span's generation: %q, want 1", got)
	}
	var children []string
	for _, sp := range trace {
		if sp.Parent == sync.SpanID {
			children = append(children, sp.Name)
		}
	}
	for _, want := range []string{controller.SpanQueueWait, "Registry insert", controller.SpanStatusWrite} { // a new Student: no read first
		if !slices.Contains(children, want) {
			t.Errorf("the sync span has no child %q; it has %v", want, children)
		}
	}
	var apiserver []string
	for _, sp := range trace {
		if sp.Service == "apiserver" {
			apiserver = append(apiserver, sp.Name)
		}
	}
	if !slices.Contains(apiserver, "etcdserverpb.KV/Txn") {
		t.Errorf("kube-apiserver's spans in the sync's trace reach no etcd request: %v", apiserver)
	}
}
