// Package gatewaytest starts a whole lockgate for a test and stops it when
// the test ends, as net/http/httptest does for an HTTP server. It is for
// tests only; nothing of the product imports it.
package gatewaytest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
)

// stopBudget bounds a gateway's shutdown after its test: well above its
// own ShutdownTimeout, so that only a gateway that hangs fails the test.
const stopBudget = 20 * time.Second

// Gateway is a running lockgate with the addresses to reach it.
type Gateway struct {
	*gateway.Gateway
	// URI is the proxy's connection string, Addr its host:port.
	URI, Addr string
}

// Config is the configuration a test gateway starts from: the proxy and
// the admin server on free ports, in front of upstreamURI, with dial and
// shutdown timeouts short enough for a test; the rest is config.Default.
func Config(upstreamURI string) *config.Config {
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Admin = "127.0.0.1:0"
	cfg.Upstream.URI = upstreamURI
	cfg.Upstream.DialTimeout = config.Duration(5 * time.Second)
	cfg.ShutdownTimeout = config.Duration(5 * time.Second)
	return cfg
}

// Start starts a gateway with cfg and logger (zap.NewNop when nil), and
// stops it when t ends, failing t if it stops with an error or not within
// the budget.
func Start(t testing.TB, cfg *config.Config, logger *zap.Logger) *Gateway {
	t.Helper()
	g, stop, err := Run(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	return g
}

// Run starts a gateway outside any one test, for a TestMain that shares it
// across the package; stop ends it, with an error if it stops with one or
// not within the budget.
func Run(cfg *config.Config, logger *zap.Logger) (g *Gateway, stop func() error, err error) {
	if logger == nil {
		logger = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	gg, err := gateway.Start(ctx, cfg, logger)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("gateway.Start: %w", err)
	}
	stop = func() error {
		cancel()
		select {
		case <-gg.Done():
			if err := gg.Wait(); err != nil {
				return fmt.Errorf("gateway stopped with errors: %w", err)
			}
			return nil
		case <-time.After(stopBudget):
			return fmt.Errorf("gateway did not stop within %v of its context being cancelled", stopBudget)
		}
	}
	addr := gg.ProxyAddr().String()
	return &Gateway{Gateway: gg, URI: "mongodb://" + addr + "/", Addr: addr}, stop, nil
}
