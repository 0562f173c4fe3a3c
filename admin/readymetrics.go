package admin

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

var readyCheckDesc = prometheus.NewDesc("lockgate_ready_check",
	"1 when the named readiness check passes, 0 when it fails; evaluated at scrape time, as /readyz does.",
	[]string{"check"}, nil)

// ReadinessCollector exports the readiness checks as lockgate_ready_check
// {check}, so that an alert can see an unreachable lock store even while
// no client uses it. Each scrape runs the checks once, bounded by
// CheckTimeout, like one /readyz request, or shares a run already in
// progress (Server.Ready). The check names are the fixed
// set the gateway adds, so the label is bounded.
func ReadinessCollector(s *Server) prometheus.Collector { return readyCollector{s} }

type readyCollector struct{ s *Server }

func (c readyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- readyCheckDesc }

func (c readyCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.s.Ready(context.Background()).Checks {
		v := 0.0
		if r.OK {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(readyCheckDesc, prometheus.GaugeValue, v, r.Name)
	}
}
