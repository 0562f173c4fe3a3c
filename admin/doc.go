// Package admin is lockgate's operator-facing HTTP listener: Prometheus
// metrics, liveness, readiness, and read-only JSON views mounted by the
// components that own the data (the policy and lock views).
//
// Views never change the proxy's state: every view is wrapped so that only
// GET and HEAD reach it. The one kind of handler that does change state is
// an operator action (HandleAction, such as POST /locks/release): POST only,
// and only with the configured bearer token; without a configured token it
// answers 403, so a deployment without a credential cannot change state
// over HTTP. It must never use Prometheus' global
// default registry: the registry is injected, so two gateways in one test
// process do not share or collide on metrics. Readiness checks are supplied
// by their owners; this package only runs them, bounded by a timeout, and
// reports the result.
package admin
