package lockstore

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockgate/lockgate/internal/metricset"
)

// Acquisition results, the only values of the "result" label.
const (
	resultOK      = "ok"
	resultBusy    = "busy"
	resultTimeout = "timeout"
	resultError   = "error"
)

// Store operations, the only values of the "op" label.
const (
	opAcquire = "acquire"
	opRenew   = "renew"
	opRelease = "release"
	opFind    = "find"
	opForce   = "force_release"
	opCleanup = "cleanup"
	opHello   = "hello"
	opIndex   = "create_index"
	// opHeldNamespaces reads which namespaces have a held lock.
	opHeldNamespaces = "held_namespaces"
	// opSweep finds the locks of ended sessions (one query for many).
	opSweep = "sweep_sessions"
	// opTxn records, reads and forgets what transactions' commits need.
	opTxn = "transaction"
	// opInstances writes this instance's heartbeat and reads the others'.
	opInstances = "instances"
)

// Metrics are the lock store's Prometheus collectors. Create them with
// NewMetrics, pass them with WithMetrics and register them wherever the
// caller likes (Metrics is a prometheus.Collector); nothing is registered
// globally. Label values are bounded: never ids, namespaces or sessions.
type Metrics struct {
	metricset.Set

	acquisitions *prometheus.CounterVec
	waitSeconds  prometheus.Histogram
	held         prometheus.Gauge
	roundTrips   *prometheus.CounterVec
	rtSeconds    *prometheus.HistogramVec
	expired      prometheus.Counter
	cleaned      prometheus.Counter
	handoffs     prometheus.Counter
	quiesces     prometheus.Counter
	memoryLocks  *prometheus.CounterVec
	// claimsTTL counts the TTL indexes on the claims that stayed at
	// start (claimsindex.go).
	claimsTTL prometheus.Gauge
}

// NewMetrics creates unregistered collectors.
func NewMetrics() *Metrics {
	var s metricset.Set
	m := &Metrics{
		acquisitions: metricset.Add(&s, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_lock_acquisitions_total",
			Help: "Lock acquisitions by result (ok, busy, timeout, error).",
		}, []string{"result"})),
		waitSeconds: metricset.Add(&s, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockgate_lock_wait_seconds",
			Help:    "Time acquisitions that were allowed to wait spent before succeeding or giving up.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		})),
		held: metricset.Add(&s, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lockgate_locks_held",
			Help: "Locks acquired through this instance and not yet released through it or known to be expired.",
		})),
		roundTrips: metricset.Add(&s, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_lockstore_round_trips_total",
			Help: "Round trips to the lock store by operation and outcome.",
		}, []string{"op", "outcome"})),
		rtSeconds: metricset.Add(&s, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lockgate_lockstore_round_trip_seconds",
			Help:    "Latency of round trips to the lock store by operation.",
			Buckets: []float64{.0001, .00025, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 5},
		}, []string{"op"})),
		expired: metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_lock_expired_total",
			Help: "Locks whose lease had ended when another owner took them over.",
		})),
		cleaned: metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_lock_records_cleaned_total",
			Help: "Long-idle lock records deleted by this instance.",
		})),
		handoffs: metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_lock_handoffs_total",
			Help: "Releases through this instance that handed the lock straight to a waiter on this instance.",
		})),
		quiesces: metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_lock_quiesce_waits_total",
			Help: "Releases, force-releases and handoffs through this instance of a lock held or changed through another instance, which waited for that instance's cache to stop trusting the lock.",
		})),
		memoryLocks: metricset.Add(&s, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_implicit_memory_locks_total",
			Help: "Implicit locks of legacy writes by where they were held: memory (this instance alone on the lock store, no round trip) or store (the memory lock was not possible).",
		}, []string{"where"})),
		claimsTTL: metricset.Add(&s, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lockgate_lockstore_claims_ttl_indexes",
			Help: "TTL indexes on the lock store's claims collection that this instance found at start and could not drop: each deletes claims by age, which can hand out a fencing token twice; the Error log says what to run.",
		})),
	}
	m.Set = s
	m.memoryLocks.WithLabelValues("memory")
	m.memoryLocks.WithLabelValues("store")
	// At zero from the start: dashboards show each result from the first
	// scrape, not "no data" until it happens once.
	for _, r := range []string{resultOK, resultBusy, resultTimeout, resultError} {
		m.acquisitions.WithLabelValues(r)
	}
	// The alert on failing round trips divides errors by all round trips:
	// an op's first error must find its series there already.
	for _, op := range []string{opAcquire, opRenew, opRelease, opFind, opForce, opCleanup, opHello, opIndex,
		opHeldNamespaces, opSweep, opTxn, opInstances} {
		m.roundTrips.WithLabelValues(op, "ok")
		m.roundTrips.WithLabelValues(op, "error")
		m.rtSeconds.WithLabelValues(op)
	}
	return m
}

func (m *Metrics) roundTrip(op string, start time.Time, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.roundTrips.WithLabelValues(op, outcome).Inc()
	m.rtSeconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
}
