package guard

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the guard's Prometheus collectors.
type Metrics struct {
	lockCommands   *prometheus.CounterVec
	lockCmdSeconds *prometheus.HistogramVec
	sessionsEnded  prometheus.Counter
}

// NewMetrics creates the guard's collectors; register them once.
func NewMetrics() *Metrics {
	return &Metrics{
		lockCommands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_lock_commands_total",
			Help: "Lock commands answered by the proxy, by command and result (ok or the refusal reason).",
		}, []string{"command", "result"}),
		lockCmdSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lockgate_lock_command_seconds",
			Help:    "Time to answer a lock command, waiting included.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 20),
		}, []string{"command"}),
		sessionsEnded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_sessions_ended_total",
			Help: "Sessions named by endSessions whose locks were released.",
		}),
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.lockCommands.Describe(ch)
	m.lockCmdSeconds.Describe(ch)
	m.sessionsEnded.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.lockCommands.Collect(ch)
	m.lockCmdSeconds.Collect(ch)
	m.sessionsEnded.Collect(ch)
}

func (m *Metrics) lockCommand(name, result string, took time.Duration) {
	m.lockCommands.WithLabelValues(name, result).Inc()
	m.lockCmdSeconds.WithLabelValues(name).Observe(took.Seconds())
}
