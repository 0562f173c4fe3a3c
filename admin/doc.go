// Package admin is lockgate's operator-facing HTTP listener: Prometheus
// metrics, liveness, readiness, and read-only JSON views mounted by the
// components that own the data (the policy and lock views).
//
// It must never change the proxy's state: every mounted view is wrapped so
// that only GET and HEAD reach it. It must never use Prometheus' global
// default registry: the registry is injected, so two gateways in one test
// process do not share or collide on metrics. Readiness checks are supplied
// by their owners; this package only runs them, bounded by a timeout, and
// reports the result.
package admin
