package gateway

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/lockstore"
)

// An operator who sets serverSelectionTimeoutMS on the upstream URI expects
// the proxy's own queries to give up after it, not after the built-in 5 s
// the gateway passes as the default (upstream.Options). upstream's own test
// checks the option; this one checks that the gateway's assembly keeps it.
// The ping's context outlives the URI's timeout by far and ends before the
// default: a ping that fails on its context was still selecting, so the
// URI's value was ignored.
func TestUpstreamHonoursURIServerSelectionTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()

	cfg := testConfig()
	cfg.Upstream.URI = "mongodb://" + dead + "/?serverSelectionTimeoutMS=100&connectTimeoutMS=100"
	cfg.Upstream.DialTimeout = config.Duration(100 * time.Millisecond)
	a := &assembly{ctx: context.Background(), cfg: cfg, log: zaptest.NewLogger(t)}
	defer a.undo()
	if err := a.openUpstream(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), lockstore.DefaultOpTimeout-time.Second)
	defer cancel()
	err = a.up.Ping(ctx)
	if err == nil {
		t.Fatal("ping of a closed port succeeded")
	}
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		t.Fatalf("ping ended on its own context (%v): the URI's serverSelectionTimeoutMS=100 was not applied", err)
	}
}
