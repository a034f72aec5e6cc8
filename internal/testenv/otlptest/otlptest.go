// Package otlptest is an OpenTelemetry collector for tests: it takes OTLP/gRPC trace
// exports on a local port and keeps the spans.
package otlptest

import (
	"context"
	"encoding/hex"
	"net"
	"strconv"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonv1 "go.opentelemetry.io/proto/otlp/common/v1"
	tracev1 "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// Span is a received span with what the tests compare: its service (the resource's
// service.name), names, IDs and string attributes.
type Span struct {
	Service, Name           string
	TraceID, SpanID, Parent string
	Attributes              map[string]string
}

// Collector receives spans until the test ends.
type Collector struct {
	collectortrace.UnimplementedTraceServiceServer
	// Endpoint is where it listens: HOST:PORT on loopback.
	Endpoint string
	mu       sync.Mutex
	spans    []Span
}

// Start starts a collector on a free loopback port; it stops when tb ends.
func Start(tb testing.TB) *Collector {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	c := &Collector{Endpoint: l.Addr().String()}
	server := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(server, c)
	go func() { _ = server.Serve(l) }()
	tb.Cleanup(server.Stop)
	return c
}

// Export keeps the spans of one export.
func (c *Collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, spanOf(service, s))
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func spanOf(service string, s *tracev1.Span) Span {
	out := Span{Service: service, Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId()),
		SpanID: hex.EncodeToString(s.GetSpanId()), Parent: hex.EncodeToString(s.GetParentSpanId()), Attributes: map[string]string{}}
	for _, kv := range s.GetAttributes() {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonv1.AnyValue_StringValue:
			out.Attributes[kv.GetKey()] = v.StringValue
		case *commonv1.AnyValue_IntValue:
			out.Attributes[kv.GetKey()] = strconv.FormatInt(v.IntValue, 10)
		default:
			out.Attributes[kv.GetKey()] = kv.GetValue().String()
		}
	}
	return out
}

// Spans are the spans received so far.
func (c *Collector) Spans() []Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Span(nil), c.spans...)
}
