package main

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/component-base/tracing"
	tracingv1 "k8s.io/component-base/tracing/api/v1"
	"k8s.io/klog/v2"

	"github.com/student-controller/student-controller/internal/controller"
)

// startTracing returns the tracer provider of --tracing-endpoint, and a function that
// flushes and stops it; nil when tracing is off. It exports over OTLP (gRPC, no TLS:
// a collector beside the controller) as kube-apiserver does, through
// k8s.io/component-base/tracing, and samples --tracing-sampling-rate-per-million of
// the syncs.
func startTracing(ctx context.Context, opts options) (trace.TracerProvider, func(), error) {
	if opts.tracingEndpoint == "" {
		return nil, func() {}, nil
	}
	rate := opts.tracingSamplingRate
	provider, err := tracing.NewProvider(ctx, &tracingv1.TracingConfiguration{Endpoint: &opts.tracingEndpoint, SamplingRatePerMillion: &rate}, nil,
		[]resource.Option{resource.WithAttributes(attribute.String("service.name", controller.Name), attribute.String("service.version", version))})
	if err != nil {
		return nil, nil, err
	}
	stop := func() {
		// Within the shutdown's own bound: a collector gone must not hold the exit.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := provider.Shutdown(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Flushing the last spans failed")
		}
	}
	return provider, stop, nil
}
