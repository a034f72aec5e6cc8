package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// WorkqueueMetricsProvider exposes client-go's workqueue metrics to Prometheus, labelled
// by queue name. Install it once per process with workqueue.SetProvider, before any queue.
type WorkqueueMetricsProvider struct {
	adds, retries                   *prometheus.CounterVec
	depthGauge, unfinished, longest *prometheus.GaugeVec
	queueDuration, workDuration     *prometheus.HistogramVec
}

// NewWorkqueueMetricsProvider creates the workqueue metrics and registers them with reg.
func NewWorkqueueMetricsProvider(reg prometheus.Registerer) *WorkqueueMetricsProvider {
	labels := []string{"name"}
	p := &WorkqueueMetricsProvider{
		depthGauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "workqueue_depth", Help: "Current depth of the workqueue.",
		}, labels),
		adds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workqueue_adds_total", Help: "Total number of adds handled by the workqueue.",
		}, labels),
		queueDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "workqueue_queue_duration_seconds", Help: "How long an item stays in the workqueue before being requested.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 10, 10),
		}, labels),
		workDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "workqueue_work_duration_seconds", Help: "How long processing an item from the workqueue takes.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 10, 10),
		}, labels),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "workqueue_unfinished_work_seconds", Help: "Seconds of work in progress not yet observed by work_duration.",
		}, labels),
		longest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "workqueue_longest_running_processor_seconds", Help: "Seconds the longest running processor has been running.",
		}, labels),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workqueue_retries_total", Help: "Total number of retries handled by the workqueue.",
		}, labels),
	}
	reg.MustRegister(p.depthGauge, p.adds, p.queueDuration, p.workDuration, p.unfinished, p.longest, p.retries)
	return p
}

// NewDepthMetric and the methods below implement workqueue.MetricsProvider.
func (p *WorkqueueMetricsProvider) NewDepthMetric(name string) workqueue.GaugeMetric {
	return p.depthGauge.WithLabelValues(name)
}

func (p *WorkqueueMetricsProvider) NewAddsMetric(name string) workqueue.CounterMetric {
	return p.adds.WithLabelValues(name)
}

func (p *WorkqueueMetricsProvider) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return p.queueDuration.WithLabelValues(name)
}

func (p *WorkqueueMetricsProvider) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return p.workDuration.WithLabelValues(name)
}

func (p *WorkqueueMetricsProvider) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.unfinished.WithLabelValues(name)
}

func (p *WorkqueueMetricsProvider) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.longest.WithLabelValues(name)
}

func (p *WorkqueueMetricsProvider) NewRetriesMetric(name string) workqueue.CounterMetric {
	return p.retries.WithLabelValues(name)
}
