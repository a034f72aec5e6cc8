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

// The spans of one sync: SpanSync is the root, from when the key was queued to when
// the sync ended; SpanQueueWait, SpanStatusWrite and the registry's spans
// ("Registry get", "Registry upsert", ...) are its children. With the API client's
// transport traced too, each API request is a child span that kube-apiserver continues.
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

// queueTimes remembers when each key was queued, since it was last taken, for the
// span of its wait. A key queued again while it waits keeps its first time.
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

// taken returns when key was queued and forgets it; false when unknown or when q is
// nil (tracing off).
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

// timedQueue is the workqueue with the time each key was queued kept: only with
// tracing on, since its map costs an entry per waiting key.
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

// startSync starts the span of the sync of key, from when it was queued (with a child
// span of the wait) when the queue kept that: since the controller started to work at
// the earliest, as a standby's queue fills long before it leads. Off, it returns a span
// that records nothing, at no cost.
func (c *Controller) startSync(ctx context.Context, key string) (context.Context, trace.Span) {
	if c.cfg.Tracer == nil {
		return ctx, noopSpan
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(AttrStudent.String(key))}
	queued, ok := c.queueTimes.taken(key)
	if ok {
		queued = later(queued, c.working)
		opts = append(opts, trace.WithTimestamp(queued))
	}
	ctx, span := c.cfg.Tracer.Start(ctx, SpanSync, opts...)
	if ok {
		_, wait := c.cfg.Tracer.Start(ctx, SpanQueueWait, trace.WithTimestamp(queued))
		wait.End()
	}
	return ctx, span
}

func later(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

// noopSpan is the span of everything when tracing is off.
var noopSpan trace.Span = noop.Span{}

// endSync ends a sync's span with its result; an error's text is not recorded, since
// a registry error may quote what only the process should see.
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

// startSpan starts a child span named name of ctx's span when tracing is on, and
// returns noopSpan otherwise. endSpan ends it, marked failed (without the error's
// text) when err is set.
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

// tracedTransport traces the API requests made within a traced sync, as children of
// its span, and passes the trace on to kube-apiserver (W3C trace context); requests
// of no sync (watches, lists, the Lease) are left alone rather than each made a trace.
func tracedTransport(provider trace.TracerProvider) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper {
		return otelhttp.NewTransport(rt, otelhttp.WithTracerProvider(provider), otelhttp.WithPropagators(tracing.Propagators()),
			otelhttp.WithFilter(func(r *http.Request) bool { return trace.SpanContextFromContext(r.Context()).IsValid() }))
	}
}
