package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/testserver/embedded"
)

// benchLease is the lease of every lock the enforcement benchmark takes,
// and the longest lease the gateways accept: long enough that no lease
// ends (or comes within the policy's margin of its end) during a run.
const benchLease = 10 * time.Minute

// Gateway is the full production assembly (gateway.Start: proxy, guard,
// policy, lock store, admin listener) on free loopback ports.
type Gateway struct {
	gw     *gateway.Gateway
	cancel context.CancelFunc
}

// StartGateway starts lockgate in front of upstreamURI, keeping its locks
// at lockstoreURI ("" means the upstream, as in production), with the
// namespaces in enforce mode and every other namespace off. The logger is
// the production one (JSON, info level, so the audit line of every
// decision on a protected namespace is encoded) writing to a discard sink.
func StartGateway(upstreamURI, lockstoreURI string, enforce ...string) (*Gateway, error) {
	return startGateway(enforceConfig(upstreamURI, lockstoreURI, enforce...))
}

// enforceConfig is StartGateway's configuration, for a family that
// changes it before starting.
func enforceConfig(upstreamURI, lockstoreURI string, enforce ...string) *config.Config {
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Admin = "127.0.0.1:0"
	cfg.Upstream.URI = upstreamURI
	cfg.Upstream.DialTimeout = config.Duration(5 * time.Second)
	cfg.Lockstore.URI = lockstoreURI
	cfg.Lockstore.MaxLeaseMS = benchLease.Milliseconds()
	cfg.Lockstore.DefaultLeaseMS = benchLease.Milliseconds()
	for _, ns := range enforce {
		cfg.Policy.Namespaces = append(cfg.Policy.Namespaces, config.NamespaceRule{Match: ns, Mode: config.ModeEnforce})
	}
	cfg.ShutdownTimeout = config.Duration(5 * time.Second)
	return cfg
}

// startGateway starts the gateway of cfg with the production logger
// writing to a discard sink.
func startGateway(cfg *config.Config) (*Gateway, error) {
	logger, err := gateway.NewLoggerTo(cfg.Log, io.Discard)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	gw, err := gateway.Start(ctx, cfg, logger)
	if err != nil {
		cancel()
		return nil, err
	}
	return &Gateway{gw: gw, cancel: cancel}, nil
}

// Addr is the proxy's host:port.
func (g *Gateway) Addr() string { return g.gw.ProxyAddr().String() }

// Close shuts the gateway down and waits for it.
func (g *Gateway) Close() error {
	g.cancel()
	select {
	case <-g.gw.Done():
		return g.gw.Wait()
	case <-time.After(15 * time.Second):
		return errors.New("bench: gateway did not stop within 15s")
	}
}

// RoundTrips reads lockgate_lockstore_round_trips_total from the
// gateway's registry, by operation (outcomes summed).
func (g *Gateway) RoundTrips() (map[string]float64, error) {
	mfs, err := g.gw.Registry().Gather()
	if err != nil {
		return nil, err
	}
	for _, mf := range mfs {
		if mf.GetName() == "lockgate_lockstore_round_trips_total" {
			return roundTripsOf(mf), nil
		}
	}
	return map[string]float64{}, nil
}

// roundTripsDelta returns after - before, by operation, without zeros.
func roundTripsDelta(before, after map[string]float64) map[string]float64 {
	d := make(map[string]float64)
	for op, v := range after {
		if x := v - before[op]; x != 0 {
			d[op] = x
		}
	}
	return d
}

func addTo(dst, src map[string]float64) {
	for k, v := range src {
		dst[k] += v
	}
}

func total(m map[string]float64) float64 {
	var t float64
	for _, v := range m {
		t += v
	}
	return t
}

// startFerret starts the embedded FerretDB with its logs discarded.
func startFerret() (*embedded.Server, error) {
	return embedded.Start(embedded.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

// lockReply is the part of an acquireLock reply the benchmarks read.
type lockReply struct {
	Locks []struct {
		ID    bson.RawValue `bson:"_id"`
		Token int64         `bson:"token"`
	} `bson:"locks"`
}

// acquireLock runs acquireLock on db.coll in session s and returns the
// tokens, in the order of ids.
func acquireLock(ctx context.Context, db *mongo.Database, s mongo.Session, coll string, ids bson.A, lease, wait time.Duration) ([]int64, error) {
	var r lockReply
	err := db.RunCommand(mongo.NewSessionContext(ctx, s), bson.D{
		{Key: "acquireLock", Value: coll}, {Key: "ids", Value: ids},
		{Key: "leaseMS", Value: lease.Milliseconds()}, {Key: "waitMS", Value: wait.Milliseconds()},
	}).Decode(&r)
	if err != nil {
		return nil, err
	}
	if len(r.Locks) != len(ids) {
		return nil, fmt.Errorf("acquireLock of %d ids granted %d locks", len(ids), len(r.Locks))
	}
	tokens := make([]int64, len(r.Locks))
	for i, l := range r.Locks {
		tokens[i] = l.Token
	}
	return tokens, nil
}

// releaseLock runs releaseLock on db.coll in session s (ids nil: every lock
// the session holds there) and returns how many it released.
func releaseLock(ctx context.Context, db *mongo.Database, s mongo.Session, coll string, ids bson.A) (int, error) {
	cmd := bson.D{{Key: "releaseLock", Value: coll}}
	if ids != nil {
		cmd = append(cmd, bson.E{Key: "ids", Value: ids})
	}
	var r struct {
		Released int `bson:"released"`
	}
	if err := db.RunCommand(mongo.NewSessionContext(ctx, s), cmd).Decode(&r); err != nil {
		return 0, err
	}
	return r.Released, nil
}

// isLockBusy tells a LockBusy refusal.
func isLockBusy(err error) bool {
	var ce mongo.CommandError
	if errors.As(err, &ce) {
		return mongoerr.Code(ce.Code) == mongoerr.LockBusy
	}
	var we mongo.WriteException
	if errors.As(err, &we) {
		for _, e := range we.WriteErrors {
			if mongoerr.Code(e.Code) == mongoerr.LockBusy {
				return true
			}
		}
	}
	return false
}

// loadAvg is the first three fields of /proc/loadavg, or "" where there is
// none.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
