package audittrail

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metrics are the trail's Prometheus collectors. Register them on the
// gateway's registry; none has a label with an unbounded value.
type Metrics struct {
	records *prometheus.CounterVec
	// byKind are records' series, in recordKinds' order: the writer adds
	// to them after every batch without hashing the label each time.
	byKind     [len(recordKinds)]prometheus.Counter
	batch      prometheus.Histogram
	bufferUsed prometheus.GaugeFunc
	// bufferLen reads the open trail's buffer at scrape time, so that a
	// writer stuck in a write still shows its buffer filling.
	bufferLen  atomic.Pointer[func() int]
	bufferCap  prometheus.Gauge
	dropped    prometheus.Counter
	sinkErrors prometheus.Counter
	lastWrite  prometheus.Gauge
}

// NewMetrics builds the collectors; every series exists at zero from
// the start, so alerts see the first increase.
func NewMetrics() *Metrics {
	m := &Metrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_audit_records_total",
			Help: "Audit trail records written (to every sink: the files, the collection), by kind (decision, lock, checkpoint, ...).",
		}, []string{"kind"}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockgate_audit_batch_seconds",
			Help:    "Time to write one batch of audit records (and fsync it when a checkpoint or a required record is in it).",
			Buckets: []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5},
		}),
		bufferCap: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lockgate_audit_buffer_capacity",
			Help: "Size of the audit buffer (records); a full buffer drops records (bestEffort). 0: no trail.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_audit_dropped_total",
			Help: "Audit records dropped because the buffer was full; the trail records each gap as a dropped record.",
		}),
		sinkErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_audit_sink_errors_total",
			Help: "Failed writes, fsyncs or rotations of the audit trail's files, and failed inserts into its collection; the writer retries.",
		}),
		lastWrite: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lockgate_audit_last_write_timestamp_seconds",
			Help: "Unix time of the last batch the audit writer made durable or wrote.",
		}),
	}
	m.bufferUsed = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "lockgate_audit_buffer_records",
		Help: "Audit records waiting in the buffer for the writer (read at scrape time).",
	}, func() float64 {
		if f := m.bufferLen.Load(); f != nil {
			return float64((*f)())
		}
		return 0
	})
	for i, k := range recordKinds {
		m.byKind[i] = m.records.WithLabelValues(string(k))
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.records, m.batch, m.bufferUsed, m.bufferCap, m.dropped, m.sinkErrors, m.lastWrite}
}

// Dropped is the number of records dropped so far (for benchmarks and
// tests; operators read lockgate_audit_dropped_total).
func (m *Metrics) Dropped() float64 {
	var d dto.Metric
	if m.dropped.Write(&d) != nil {
		return 0
	}
	return d.GetCounter().GetValue()
}
