package guard

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/internal/metricset"
	"github.com/lockgate/lockgate/policy"
)

// Metrics are the guard's Prometheus collectors; the Set makes them one
// prometheus.Collector.
type Metrics struct {
	metricset.Set

	lockCommands   *prometheus.CounterVec
	lockCmdSeconds *prometheus.HistogramVec
	sessionsEnded  prometheus.Counter

	decisions       *prometheus.CounterVec
	decisionSeconds prometheus.Histogram
	pinned          prometheus.Counter
	// fencedOut counts statements the document fence refused.
	fencedOut prometheus.Counter
	// inFlightRenewals counts renewals of locks under writes in flight.
	inFlightRenewals prometheus.Counter

	reservedRefusals *prometheus.CounterVec

	resolves       *prometheus.CounterVec
	resolveSeconds prometheus.Histogram

	insertChecks *prometheus.CounterVec

	// implicitLocks and implicitWait: writes of sessions holding no lock,
	// under unlockedWriters (implicit.go).
	implicitLocks *prometheus.CounterVec
	implicitWait  *prometheus.HistogramVec
}

// NewMetrics creates the guard's collectors; register them once.
func NewMetrics() *Metrics {
	var s metricset.Set
	m := &Metrics{
		lockCommands: metricset.Add(&s, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_lock_commands_total",
			Help: "Lock commands answered by the proxy, by command and result (ok or the refusal reason).",
		}, []string{"command", "result"})),
		lockCmdSeconds: metricset.Add(&s, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lockgate_lock_command_seconds",
			Help:    "Time to answer a lock command, waiting included.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 20),
		}, []string{"command"})),
		sessionsEnded: metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_sessions_ended_total",
			Help: "Sessions named by endSessions whose locks were released.",
		})),
		decisions: metricset.Add(&s, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_decisions_total",
			Help: "Decisions on writes to audited and enforced namespaces, by policy rule (its match pattern, or default), decision and reason.",
		}, []string{"rule", "decision", "reason"})),
		decisionSeconds: metricset.Add(&s, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockgate_decision_seconds",
			Help:    "Time to decide a write on an audited or enforced namespace, lock checks and resolution included.",
			Buckets: prometheus.ExponentialBuckets(5e-6, 2, 20),
		})),
		inFlightRenewals: metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_inflight_renewals_total",
			Help: "Lease renewals of locks whose enforced write was still unanswered by the database.",
		})),
		fencedOut: metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_fenced_out_writes_total",
			Help: "Write statements the database refused because a newer lock holder had stamped the document (document fence).",
		})),
		pinned: metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_pinned_writes_total",
			Help: "Writes whose filter did not pin _id, forwarded restricted to the verified documents.",
		})),
		insertChecks: metricset.Add(&s, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_insert_checks_total",
			Help: "Inserts on protected namespaces checked for ids another session has locked: checked (one lock store round trip), skipped (no lock held in the namespace).",
		}, []string{"result"})),
		resolves: metricset.Add(&s, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_resolves_total",
			Help: "Resolutions of write filters that name no _id, by result: ok, timeout (no slot or no answer within the resolve timeout), error, skipped (an audited write found no free slot, or the write was refused already).",
		}, []string{"result"})),
		resolveSeconds: metricset.Add(&s, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockgate_resolve_seconds",
			Help:    "Time a resolution query took, from holding a slot to its answer.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 18),
		})),
		reservedRefusals: metricset.Add(&s, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_reserved_refusals_total",
			Help: "Client requests refused whatever the policy's modes, by what they reached for: lock_store (its own namespaces) or session_introspection (other clients' session ids).",
		}, []string{"what"})),
		implicitLocks: metricset.Add(&s, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_implicit_locks_total",
			Help: "Enforced writes of sessions that hold none of their locks, under unlockedWriters, by mode (refuseIfLocked, wait) and outcome: taken (free at once), waited (taken after queueing), refused (held, refuseIfLocked), timeout (still held after unlockedWaitMS), error (the lock store failed).",
		}, []string{"mode", "outcome"})),
		implicitWait: metricset.Add(&s, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lockgate_implicit_lock_wait_seconds",
			Help:    "Time to take a write's implicit locks (unlockedWriters), queueing included, by mode.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 20),
		}, []string{"mode"})),
	}
	m.Set = s
	// Series that dashboards and alerts name exist from the start, at
	// zero: a counter that appears at 1 on its first event shows "no
	// data" until then, and increase() cannot see that first event.
	for _, what := range []string{"lock_store", "session_introspection"} {
		m.reservedRefusals.WithLabelValues(what)
	}
	for _, c := range []string{cmdAcquire, cmdRenew, cmdRelease, cmdStatus} {
		for _, r := range lockCommandResults {
			m.lockCommands.WithLabelValues(c, r)
		}
		m.lockCmdSeconds.WithLabelValues(c)
	}
	for _, mode := range []config.UnlockedWriters{config.UnlockedRefuseIfLocked, config.UnlockedWait} {
		for _, o := range implicitOutcomes {
			m.implicitLocks.WithLabelValues(string(mode), o)
		}
		m.implicitWait.WithLabelValues(string(mode))
	}
	return m
}

// lockCommandResults are the values of lockgate_lock_commands_total's
// result label: ok, or why lockCommand refused (the reasons its parser,
// lockCommandMayRun, storeError and the fence stamp give). Every command
// gets every result at zero: a few series that stay at zero cost less than
// a refusal the dashboard and alerts see only from its second occurrence.
var lockCommandResults = []string{"ok", refuse.ReasonBadArgument, refuse.ReasonNoSession, refuse.ReasonHeld, refuse.ReasonTimeout,
	refuse.ReasonNotHolder, refuse.ReasonUnavailable, refuse.ReasonInternal, refuse.ReasonInFlight, refuse.ReasonTooManyWaiters, refuse.ReasonTooManyLocks,
	refuse.ReasonUnauthenticated, refuse.ReasonUnauthorized, refuse.ReasonNoCollection, reasonFenceStamp}

// implicitOutcomes are the outcome label's values.
var implicitOutcomes = []string{"taken", "waited", "refused", "timeout", "error"}

// implicit counts one write's implicit acquire and how long it took.
func (m *Metrics) implicit(mode config.UnlockedWriters, outcome string, took time.Duration) {
	m.implicitLocks.WithLabelValues(string(mode), outcome).Inc()
	m.implicitWait.WithLabelValues(string(mode)).Observe(took.Seconds())
}

// knownDecisions makes the decision series of every rule of p exist at
// zero (see NewMetrics): allowed, and each refusal reason the metric
// distinguishes, as reject where the rule can enforce and would_reject
// where it can audit. The set is bounded by the policy's rules.
func (m *Metrics) knownDecisions(p *policy.Policy) {
	rules, fallback := p.Rules()
	for _, r := range append(rules, fallback) {
		modes := []policy.Mode{r.Mode}
		if r.Clients != nil {
			modes = append(modes, r.Clients.Others)
		}
		for _, mode := range modes {
			var refusal string
			switch mode {
			case policy.Enforce:
				refusal = enforce.DecisionReject
			case policy.Audit:
				refusal = enforce.DecisionWouldReject
			default:
				continue
			}
			m.decisions.WithLabelValues(r.Match, enforce.DecisionAllow, metricReason(""))
			for _, reason := range metricReasons {
				m.decisions.WithLabelValues(r.Match, refusal, reason)
			}
		}
	}
}

func (m *Metrics) lockCommand(name, result string, took time.Duration) {
	m.lockCommands.WithLabelValues(name, result).Inc()
	m.lockCmdSeconds.WithLabelValues(name).Observe(took.Seconds())
}

// Lock command names, as the lockgate_lock_commands_total label values
// (metrics.go). What each command does and accepts is its entry in the
// command table (wire.RoleLock, wire.LockOp, Args): the proxy answers them
// and never forwards them.
const (
	cmdAcquire = "acquireLock"
	cmdRenew   = "renewLock"
	cmdRelease = "releaseLock"
	cmdStatus  = "lockStatus"
)
