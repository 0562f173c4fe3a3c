package lockgate_test

import (
	"context"
	"os"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/gateway/gatewaytest"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
)

// upstream is the embedded FerretDB every test's gateway fronts.
var upstream *embedded.Server

func TestMain(m *testing.M) {
	os.Exit(testkit.RunMain(m, embedded.Shared(&upstream, embedded.Options{})))
}

// startGateway starts a lockgate in front of the embedded upstream that
// enforces every collection of database "kit". lockURI is the lock
// store's connection string ("" = the upstream).
func startGateway(t *testing.T, lockURI string) *gateway.Gateway {
	t.Helper()
	cfg := gatewaytest.Config(upstream.URI())
	cfg.Lockstore.URI = lockURI
	cfg.Policy.Namespaces = []config.NamespaceRule{{Match: "kit.*", Mode: config.ModeEnforce}}
	return gatewaytest.Start(t, cfg, nil).Gateway
}

func connect(t *testing.T, uri, app string) *mongo.Client {
	t.Helper()
	c, err := mongo.Connect(context.Background(), options.Client().ApplyURI(uri).SetAppName(app).SetServerSelectionTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		c.Disconnect(ctx)
	})
	return c
}

func startSession(t *testing.T, c *mongo.Client) mongo.Session {
	t.Helper()
	s, err := c.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.EndSession(context.Background()) })
	return s
}
