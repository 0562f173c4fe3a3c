package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockgate/lockgate/internal/metricset"
	"github.com/lockgate/lockgate/wire"
)

// Directions of traffic, the values of the "direction" label.
const (
	toUpstream = "client_to_upstream"
	toClient   = "upstream_to_client"
)

// Error kinds, the values of the "kind" label of lockgate_errors_total.
const (
	errMalformed     = "malformed"      // a client message failed to decode
	errTooLarge      = "too_large"      // a message exceeded the size limits
	errUpstreamDial  = "upstream_dial"  // no upstream connection for a client
	errUpstreamIO    = "upstream_io"    // reading or writing the upstream failed
	errUpstreamReply = "upstream_reply" // an upstream reply could not be handled
	errClientIO      = "client_io"      // reading or writing the client failed mid-message
	errUnackRejected = "unack_rejected" // a moreToCome request was refused: connection closed
	errPanic         = "panic"          // a connection handler panicked
	errSlowClient    = "slow_client"    // a message trickled in, or replies were not read
)

// Metrics are the proxy's Prometheus collectors. Create them with
// NewMetrics and register them once; they are safe for concurrent use.
type Metrics struct {
	metricset.Set

	connsOpen      prometheus.Gauge
	connsTotal     prometheus.Counter
	connsRefused   prometheus.Counter
	acceptErrors   prometheus.Counter
	messages       map[string]prometheus.Counter
	bytes          map[string]prometheus.Counter
	commandsVec    *prometheus.CounterVec
	commands       map[string]prometheus.Counter
	otherCommand   prometheus.Counter `metricset:"child"` // commandsVec's "other"
	unknownCommand prometheus.Counter
	legacyOps      *prometheus.CounterVec
	roundTrip      prometheus.Histogram
	errorsVec      *prometheus.CounterVec
	helloRewrites  prometheus.Counter
	proxyReplies   prometheus.Counter
	messagesVec    *prometheus.CounterVec
	bytesVec       *prometheus.CounterVec
	retiredConns   prometheus.Counter
	droppedReplies prometheus.Counter
}

// NewMetrics creates the proxy's collectors.
func NewMetrics() *Metrics {
	var s metricset.Set
	m := &Metrics{
		connsOpen: metricset.Add(&s, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lockgate_client_connections",
			Help: "Client connections currently open.",
		})),
		connsRefused: metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_client_connections_refused_total",
			Help: "Client connections closed on arrival because maxConnections were open.",
		})),
		acceptErrors: metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_accept_errors_total",
			Help: "Temporary accept failures (out of file descriptors or buffers), each followed by a backoff and a retry.",
		})),
		connsTotal: metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_client_connections_total",
			Help: "Client connections accepted.",
		})),
		messagesVec: metricset.Add(&s, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_messages_total",
			Help: "Wire messages relayed or answered, by direction.",
		}, []string{"direction"})),
		bytesVec: metricset.Add(&s, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_message_bytes_total",
			Help: "Bytes of wire messages relayed or answered, by direction.",
		}, []string{"direction"})),
		commandsVec: metricset.Add(&s, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_commands_total",
			Help: "Client commands by name; names outside a fixed list count as other.",
		}, []string{"command"})),
		legacyOps: metricset.Add(&s, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_legacy_opcodes_total",
			Help: "Client messages in legacy opcodes that carry no command, by opcode.",
		}, []string{"opcode"})),
		roundTrip: metricset.Add(&s, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockgate_upstream_roundtrip_seconds",
			Help:    "Time from forwarding a request to the upstream to the first byte of its reply being read back.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 18),
		})),
		errorsVec: metricset.Add(&s, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockgate_errors_total",
			Help: "Errors by kind; each closes the client connection it happened on, or was answered with an error reply.",
		}, []string{"kind"})),
		helloRewrites: metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_handshake_rewrites_total",
			Help: "hello/isMaster replies rewritten so that drivers keep talking to the proxy.",
		})),
		proxyReplies: metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_proxy_replies_total",
			Help: "Replies the proxy made itself instead of forwarding the request.",
		})),
		retiredConns: metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockgate_retired_connections_total",
			Help: "Client connections closed because the upstream server they were bound to stopped being the primary.",
		})),
	}
	m.unknownCommand = metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockgate_unknown_commands_total",
		Help: "Client commands not in lockgate's command table (wire/commands.go): relayed where nothing enforced is in reach, refused as unclassifiable where something is.",
	}))
	m.droppedReplies = metricset.Add(&s, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockgate_dropped_replies_total",
		Help: "Upstream replies to fire-and-forget (moreToCome) requests, which the protocol forbids, dropped instead of confusing the client.",
	}))
	m.messages = map[string]prometheus.Counter{
		toUpstream: m.messagesVec.WithLabelValues(toUpstream),
		toClient:   m.messagesVec.WithLabelValues(toClient),
	}
	m.bytes = map[string]prometheus.Counter{
		toUpstream: m.bytesVec.WithLabelValues(toUpstream),
		toClient:   m.bytesVec.WithLabelValues(toClient),
	}
	// Only the command table's counted commands get a label of their
	// own, so clients cannot grow the label set.
	m.commands = map[string]prometheus.Counter{}
	for _, c := range wire.Commands() {
		if c.Counted {
			m.commands[c.Name] = m.commandsVec.WithLabelValues(c.Name)
		}
	}
	m.otherCommand = m.commandsVec.WithLabelValues("other")
	for _, k := range []string{errMalformed, errTooLarge, errUpstreamDial, errUpstreamIO, errUpstreamReply, errClientIO, errUnackRejected, errPanic, errSlowClient} {
		m.errorsVec.WithLabelValues(k)
	}
	m.Set = s
	return m
}

func (m *Metrics) command(cmd *wire.Command) {
	spec := cmd.Spec()
	if spec == nil {
		m.unknownCommand.Inc()
	} else if c, ok := m.commands[spec.Name]; ok {
		c.Inc()
		return
	}
	m.otherCommand.Inc()
}

func (m *Metrics) message(direction string, n int) {
	m.messages[direction].Inc()
	m.bytes[direction].Add(float64(n))
}

func (m *Metrics) error(kind string) {
	m.errorsVec.WithLabelValues(kind).Inc()
}
