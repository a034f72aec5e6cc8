package controller

import (
	"context"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/tracing"
)

// TracerName names the controller's tracer (the instrumentation scope of its spans).
const TracerName = "github.com/student-controller/student-controller/internal/controller"

// The spans of one sync: SpanSync is the root, from when the key was queued to the sync's
// end. Its children are SpanQueueWait, SpanStatusWrite, the registry's spans ("Registry
// get", ...) and each traced API request, which kube-apiserver continues.
const (
	SpanSync        = "Sync Student"
	SpanQueueWait   = "Queue wait"
	SpanStatusWrite = "Update status"
	spanRegistry    = "Registry "
)

// The attributes of a sync's span, as its log lines name them.
const (
	AttrStudent    = attribute.Key("student")
	AttrUID        = attribute.Key("uid")
	AttrGeneration = attribute.Key("generation")
	AttrResult     = attribute.Key("result")
)

// queueTimes is when each waiting key was first queued, for the span of its wait.
type queueTimes struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (q *queueTimes) queued(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.at[key]; !ok {
		q.at[key] = time.Now()
	}
}

// taken returns when key was queued and forgets it; false if unknown or q is nil.
func (q *queueTimes) taken(key string) (time.Time, bool) {
	if q == nil {
		return time.Time{}, false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	at, ok := q.at[key]
	delete(q.at, key)
	return at, ok
}

// timedQueue records queue times: only when tracing, as its map costs an entry per key.
type timedQueue struct {
	workqueue.TypedRateLimitingInterface[string]
	times *queueTimes
}

func (q timedQueue) Add(key string) {
	q.times.queued(key)
	q.TypedRateLimitingInterface.Add(key)
}

func (q timedQueue) AddAfter(key string, d time.Duration) {
	q.times.queued(key)
	q.TypedRateLimitingInterface.AddAfter(key, d)
}

func (q timedQueue) AddRateLimited(key string) {
	q.times.queued(key)
	q.TypedRateLimitingInterface.AddRateLimited(key)
}

// startSync starts key's sync span from when it was queued (with a wait span), but not
// before work began: a standby's queue fills long before it leads. Off, it is noopSpan.
func (c *Controller) startSync(ctx context.Context, key string) (context.Context, trace.Span) {
	if c.cfg.Tracer == nil {
		return ctx, noopSpan
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(AttrStudent.String(key))}
	queued, ok := c.queueTimes.taken(key)
	if ok {
		if queued.Before(c.working) {
			queued = c.working
		}
		opts = append(opts, trace.WithTimestamp(queued))
	}
	ctx, span := c.cfg.Tracer.Start(ctx, SpanSync, opts...)
	if ok {
		_, wait := c.cfg.Tracer.Start(ctx, SpanQueueWait, trace.WithTimestamp(queued))
		wait.End()
	}
	return ctx, span
}

// noopSpan is the span of everything when tracing is off.
var noopSpan trace.Span = noop.Span{}

// endSync ends a sync's span with its result, not the error's text: it may quote secrets.
func endSync(span trace.Span, result string, err error) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrResult.String(result))
	if err != nil {
		span.SetStatus(codes.Error, result)
	}
	span.End()
}

// startSpan starts a child span of ctx's when tracing is on, else noopSpan. endSpan ends
// it, marked failed (without the error's text) when err is set.
func startSpan(ctx context.Context, tracer trace.Tracer, name string) (context.Context, trace.Span) {
	if tracer == nil {
		return ctx, noopSpan
	}
	return tracer.Start(ctx, name)
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, "failed")
	}
	span.End()
}

// tracedTransport traces the API requests of a traced sync as children of its span and
// passes the trace to kube-apiserver; other requests (watches, the Lease) are left alone.
func tracedTransport(provider trace.TracerProvider) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper {
		return otelhttp.NewTransport(rt, otelhttp.WithTracerProvider(provider), otelhttp.WithPropagators(tracing.Propagators()),
			otelhttp.WithFilter(func(r *http.Request) bool { return trace.SpanContextFromContext(r.Context()).IsValid() }))
	}
}
