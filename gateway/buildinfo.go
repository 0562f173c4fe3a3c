package gateway

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockgate/lockgate/proxy"
)

// BuildInfo is lockgate_build_info{version, goversion} = 1: which release
// runs where, for dashboards and rollouts. The binary passes it to Start
// with its own version string (set at link time), which the gateway
// cannot know.
func BuildInfo(version string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "lockgate_build_info",
		Help:        "Always 1; the labels say which lockgate build runs.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}

// connectionLimit is lockgate_client_connections_max, the limit in force
// (configured, or derived from the file descriptor limit), so that an
// alert can compare lockgate_client_connections with it.
func connectionLimit(configured int) prometheus.Collector {
	if configured <= 0 {
		configured = proxy.DefaultMaxConnections()
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lockgate_client_connections_max",
		Help: "Client connections allowed at once (limits.maxConnections, or the value derived from the file descriptor limit).",
	})
	g.Set(float64(configured))
	return g
}
