// Package gateway assembles a running lockgate from a validated
// *config.Config: the Prometheus registry, the upstream, the proxy server
// and the admin listener, with their lifecycles tied to one context.
//
// It is the only place that knows how the components fit together, so the
// binaries stay thin (cmd/proxy for production, cmd/devstack for
// development) and tests can start a whole gateway on 127.0.0.1:0.
//
// It must never read the environment, flags or files other than those the
// config names (TLS material), install signal handlers, exit the process,
// or register anything in a global registry: those belong to the binaries,
// and keeping them out lets several gateways run in one test process. It
// must never import testserver/embedded: cmd/proxy depends on this package,
// and FerretDB must stay out of the production binary.
package gateway
