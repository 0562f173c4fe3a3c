package gateway

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap/zaptest"

	"github.com/lockgate/lockgate/config"
)

// secretFile writes content to a file only its owner may read, where
// lockgate expects an admin token or an audit key: it refuses files
// others can read.
func secretFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// testGateway is a gateway started for one test, with the context its
// clients use.
type testGateway struct {
	*Gateway
	ctx context.Context
	// admin is the admin listener's base URL.
	admin string

	cancel   context.CancelFunc
	stopOnce sync.Once
	stopErr  error
}

// startGateway starts cfg; the gateway stops when the test ends, and an
// error it ends with then (other than its cancellation) fails the test.
// A test that reads what the gateway leaves behind (its audit trail)
// stops it itself first.
func startGateway(t *testing.T, cfg *config.Config) *testGateway {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	gw, err := Start(ctx, cfg, zaptest.NewLogger(t))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	g := &testGateway{Gateway: gw, ctx: ctx, admin: "http://" + gw.AdminAddr().String(), cancel: cancel}
	t.Cleanup(func() {
		if err := g.stop(); err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	})
	return g
}

// stop cancels the gateway and waits until it has stopped; it returns
// what Wait returned, the same on every call.
func (g *testGateway) stop() error {
	g.stopOnce.Do(func() {
		g.cancel()
		g.stopErr = g.Wait()
	})
	return g.stopErr
}

// session connects a client named app through the gateway and starts a
// session on it; both end with the test.
func (g *testGateway) session(t *testing.T, app string) (*mongo.Client, mongo.SessionContext) {
	t.Helper()
	c, err := mongo.Connect(g.ctx, options.Client().ApplyURI("mongodb://"+g.ProxyAddr().String()+"/").SetAppName(app))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Disconnect(context.Background()) })
	s, err := c.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.EndSession(context.Background()) })
	return c, mongo.NewSessionContext(g.ctx, s)
}
