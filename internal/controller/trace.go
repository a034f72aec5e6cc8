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

// taken returns when key was queued and forgets it; false when unknown.
func (q *queueTimes) taken(key string) (time.Time, bool) {
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

// tracer is Config.Tracer, or one that records nothing.
func (c *Controller) tracer() trace.Tracer {
	if c.cfg.Tracer == nil {
		return noop.NewTracerProvider().Tracer(TracerName)
	}
	return c.cfg.Tracer
}

// startSync starts the span of the sync of key, from when it was queued (with a child
// span of the wait) when the queue kept that.
func (c *Controller) startSync(ctx context.Context, key string) (context.Context, trace.Span) {
	if c.cfg.Tracer == nil {
		return ctx, trace.SpanFromContext(ctx) // a span that records nothing: no cost
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(AttrStudent.String(key))}
	queued, ok := time.Time{}, false
	if q, isTimed := c.queue.(timedQueue); isTimed {
		queued, ok = q.times.taken(key)
	}
	if ok {
		opts = append(opts, trace.WithTimestamp(queued))
	}
	ctx, span := c.cfg.Tracer.Start(ctx, SpanSync, opts...)
	if ok {
		_, wait := c.cfg.Tracer.Start(ctx, SpanQueueWait, trace.WithTimestamp(queued))
		wait.End()
	}
	return ctx, span
}

// endSync ends a sync's span with its result; an error's text is not recorded, since
// a registry error may quote what only the process should see.
func endSync(span trace.Span, result string, err error) {
	span.SetAttributes(AttrResult.String(result))
	if err != nil {
		span.SetStatus(codes.Error, result)
	}
	span.End()
}

// spanOf starts a child span named name of ctx's span, when tracing is on.
func spanOf(ctx context.Context, tracer trace.Tracer, name string) (context.Context, func(err error)) {
	if tracer == nil {
		return ctx, func(error) {}
	}
	ctx, span := tracer.Start(ctx, name)
	return ctx, func(err error) {
		if err != nil {
			span.SetStatus(codes.Error, "failed")
		}
		span.End()
	}
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
