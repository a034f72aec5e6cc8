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

// startTracing returns --tracing-endpoint's tracer provider (nil when off) and its
// flushing stop. Like kube-apiserver's: OTLP over gRPC, no TLS, to a collector beside it.
func startTracing(ctx context.Context, opts options) (trace.TracerProvider, func(), error) {
	if opts.tracingEndpoint == "" {
		return nil, func() {}, nil
	}
	provider, err := tracing.NewProvider(ctx, opts.tracingConfig(), nil,
		[]resource.Option{resource.WithAttributes(attribute.String("service.name", controller.Name), attribute.String("service.version", version))})
	if err != nil {
		return nil, nil, err
	}
	return provider, func() {
		// A collector gone holds the exit 5 s at most, after the drain.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := provider.Shutdown(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Flushing the last spans failed")
		}
	}, nil
}

// tracingConfig is the tracing flags as kube-apiserver's TracingConfiguration.
func (o *options) tracingConfig() *tracingv1.TracingConfiguration {
	endpoint, rate := o.tracingEndpoint, int32(min(max(o.tracingSamplingRate, 0), 1000000)) // #nosec G115 -- clamped
	return &tracingv1.TracingConfiguration{Endpoint: &endpoint, SamplingRatePerMillion: &rate}
}
