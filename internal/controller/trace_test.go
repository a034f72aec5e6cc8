package controller

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSyncSpans: with a tracer, the sync of a new Student is one trace: the sync's
// span, from when its key was queued, with the Student's key, uid, generation and
// result, and as its children the queue wait, the registry's write (an insert, with no
// read first) and the status write. Without one, nothing is recorded and the queue
// keeps no times.
func TestSyncSpans(t *testing.T) {
	f := newFixture(t)
	recorder := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	c, err := New(f.ctx, f.client, f.informers, f.registry, f.recorder, Config{Owner: owner, Tracer: provider.Tracer(TracerName)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.queue.ShutDown()
	s := newStudent("a", withFinalizer)
	if _, err := f.client.BolingcavalryV1().Students(s.Namespace).Create(f.ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.observe(s.Namespace, s.Name)
	c.queue.Add("school/a")
	if !c.processNextWorkItem(f.ctx) {
		t.Fatal("the queue shut down")
	}
	if rows := f.rows(); len(rows) != 1 {
		t.Fatalf("rows after the sync: %v, want one", rows)
	}

	spans := recorder.Ended()
	var root sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == SpanSync {
			root = s
		}
	}
	if root == nil {
		t.Fatalf("no %q span among %d", SpanSync, len(spans))
	}
	attrs := map[attribute.Key]string{}
	for _, kv := range root.Attributes() {
		attrs[kv.Key] = kv.Value.String()
	}
	want := map[attribute.Key]string{AttrStudent: "school/a", AttrUID: "uid-a", AttrGeneration: "1", AttrResult: resultSuccess}
	if diff := cmp.Diff(want, attrs); diff != "" {
		t.Errorf("the sync span's attributes (-want +got):\n%s", diff)
	}
	var children []string
	for _, s := range spans {
		if s.Parent().SpanID() == root.SpanContext().SpanID() {
			children = append(children, s.Name())
			if s.StartTime().Before(root.StartTime()) || s.EndTime().After(root.EndTime()) {
				t.Errorf("span %q (%v to %v) outside the sync's (%v to %v)", s.Name(), s.StartTime(), s.EndTime(), root.StartTime(), root.EndTime())
			}
		}
	}
	wantChildren := []string{SpanQueueWait, "Registry insert", SpanStatusWrite} // a new Student's row: no read first
	if diff := cmp.Diff(wantChildren, children); diff != "" {
		t.Errorf("the sync span's children, in the order they ended (-want +got):\n%s", diff)
	}
	if root.Parent().IsValid() || root.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("the sync span: parent %v, kind %v; want a root of kind consumer", root.Parent(), root.SpanKind())
	}

	if n := len(c.queueTimes.at); n != 0 {
		t.Errorf("queue times kept after the sync: %d, want none", n)
	}

	// Off: no times kept, no spans, no allocation for them.
	if f.ctrl.queueTimes != nil {
		t.Error("a controller without a tracer keeps the queue's times")
	}
	if allocs := testing.AllocsPerRun(100, func() {
		ctx, span := f.ctrl.startSync(f.ctx, "school/a")
		_, reg := timedRegistry{Registry: f.registry}.start(ctx, "get") // the metric's own cost apart
		reg.end(nil)
		_, status := startSpan(ctx, nil, SpanStatusWrite)
		endSpan(status, nil)
		endSync(span, resultSuccess, nil)
	}); allocs != 0 {
		t.Errorf("a sync's spans, tracing off: %v allocations, want none", allocs)
	}
}
