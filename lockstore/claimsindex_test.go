package lockstore

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/event"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/wire"
)

// TestClaimsIndexIsNeverTTL: against the real upstream, every
// createIndexes the store sends for its claims asks for a plain index. A
// TTL index there would delete claims by age whatever their key's head
// says, the gap compactClaims closes (TestStaleHeadAfterCompaction).
// FerretDB refuses TTL indexes, so the request is what tells.
func TestClaimsIndexIsNeverTTL(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	claims := cfg.Collection + ClaimsSuffix
	var mu sync.Mutex
	var sent []bson.Raw
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName == "createIndexes" {
			mu.Lock()
			sent = append(sent, append(bson.Raw(nil), e.Command...))
			mu.Unlock()
		}
	}}
	client, err := mongo.Connect(context.Background(), options.Client().ApplyURI(cfg.URI).SetMonitor(mon))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	s := openStore(t, cfg, WithClient(client))

	mu.Lock()
	var forClaims int
	for _, c := range sent {
		if c.Lookup("createIndexes").StringValue() != claims {
			continue
		}
		forClaims++
		if _, err := c.LookupErr("indexes", "0", "expireAfterSeconds"); err == nil {
			t.Errorf("the store asked for a TTL index on its claims: %v", c)
		}
	}
	mu.Unlock()
	if forClaims == 0 {
		t.Fatalf("no createIndexes for %s among %d sent", claims, len(sent))
	}
	spec := claimsAtIndex(t, s)
	if spec == nil {
		t.Fatalf("no {at: 1} index on %s", claims)
	}
	if _, err := spec.LookupErr("expireAfterSeconds"); err == nil {
		t.Errorf("the claims' {at: 1} index has a TTL: %v", spec)
	}
}

// claimsAtIndex is the spec of the claims' index on exactly {at: 1}, nil
// when there is none.
func claimsAtIndex(t *testing.T, s *Store) bson.Raw {
	t.Helper()
	cur, err := s.claims.Indexes().List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var specs []bson.Raw
	if err := cur.All(context.Background(), &specs); err != nil {
		t.Fatal(err)
	}
	for _, spec := range specs {
		if keys, ok := spec.Lookup("key").DocumentOK(); ok && isAtKey(keys) {
			return spec
		}
	}
	return nil
}

func isAtKey(keys bson.Raw) bool {
	els, err := keys.Elements()
	if err != nil || len(els) != 1 || els[0].Key() != "at" {
		return false
	}
	v, ok := els[0].Value().AsInt64OK()
	return ok && v == 1
}

// upgradedMongo plays a MongoDB on which an older lockgate made the
// claims' {at: 1} index a TTL index (FerretDB cannot make one): it lists
// that index for the claims collection, answers dropIndexes with
// dropRefusal (nil: ok) and everything else of the store's start-up with
// empty results. Every command it gets is kept, in order.
type upgradedMongo struct {
	claims      string
	dropRefusal *mongoerr.Error
	// createRefusal (nil: ok) answers createIndexes on the claims.
	createRefusal *mongoerr.Error

	mu   sync.Mutex
	cmds []bson.Raw
}

func (u *upgradedMongo) commands(name string) []bson.Raw {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []bson.Raw
	for _, c := range u.cmds {
		if name == "" || c.Lookup(name).Type != 0 {
			out = append(out, c)
		}
	}
	return out
}

func (u *upgradedMongo) start(t *testing.T) string {
	t.Helper()
	doc := func(v any) bsoncore.Document {
		b, err := bson.Marshal(v)
		if err != nil {
			t.Error(err)
		}
		return b
	}
	cursor := func(ns string, batch bson.A) bsoncore.Document {
		return doc(bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: ns}, {Key: "firstBatch", Value: batch}}}, {Key: "ok", Value: 1.0}})
	}
	srv, err := scripted.Start(func(s *scripted.Server, req wire.Message, cmd *wire.Command) [][]byte {
		if cmd == nil {
			return nil
		}
		u.mu.Lock()
		u.cmds = append(u.cmds, append(bson.Raw(nil), cmd.Body...))
		u.mu.Unlock()
		ns := cmd.DB + "." + cmd.Collection
		switch strings.ToLower(cmd.Name) {
		case "hello", "ismaster":
			return s.Reply(req, doc(bson.D{
				{Key: "helloOk", Value: true}, {Key: "ismaster", Value: true}, {Key: "isWritablePrimary", Value: true},
				{Key: "maxBsonObjectSize", Value: int32(16 << 20)}, {Key: "maxMessageSizeBytes", Value: int32(48000000)},
				{Key: "maxWriteBatchSize", Value: int32(100000)}, {Key: "localTime", Value: time.Now()},
				{Key: "logicalSessionTimeoutMinutes", Value: int32(30)}, {Key: "connectionId", Value: int32(1)},
				{Key: "minWireVersion", Value: int32(0)}, {Key: "maxWireVersion", Value: int32(17)}, {Key: "ok", Value: 1.0},
			}))
		case "listindexes":
			batch := bson.A{bson.D{{Key: "v", Value: int32(2)}, {Key: "key", Value: bson.D{{Key: "_id", Value: int32(1)}}}, {Key: "name", Value: "_id_"}}}
			if cmd.Collection == u.claims && len(u.commands("dropIndexes")) == 0 {
				batch = append(batch, bson.D{
					{Key: "v", Value: int32(2)}, {Key: "key", Value: bson.D{{Key: "at", Value: int32(1)}}},
					{Key: "name", Value: "at_1"}, {Key: "expireAfterSeconds", Value: int32(300)},
				})
			}
			return s.Reply(req, cursor(ns, batch))
		case "dropindexes":
			if u.dropRefusal != nil {
				return s.Reply(req, u.dropRefusal.Document())
			}
			return s.Reply(req, doc(bson.D{{Key: "nIndexesWas", Value: int32(2)}, {Key: "ok", Value: 1.0}}))
		case "createindexes":
			if cmd.Collection == u.claims && u.createRefusal != nil {
				return s.Reply(req, u.createRefusal.Document())
			}
			return s.Reply(req, doc(bson.D{{Key: "ok", Value: 1.0}}))
		case "find", "aggregate", "listcollections":
			return s.Reply(req, cursor(ns, bson.A{}))
		case "distinct":
			return s.Reply(req, doc(bson.D{{Key: "values", Value: bson.A{}}, {Key: "ok", Value: 1.0}}))
		}
		return s.Reply(req, doc(bson.D{{Key: "n", Value: int32(0)}, {Key: "ok", Value: 1.0}}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return "mongodb://" + srv.Addr() + "/?directConnection=true"
}

// openUpgraded opens a store on u, logging to an observer, and checks
// that it started (indexes, heartbeat and first reads done).
func openUpgraded(t *testing.T, u *upgradedMongo) (*Store, *observer.ObservedLogs) {
	t.Helper()
	cfg := testConfig(t)
	cfg.OpTimeout = 5 * time.Second
	u.claims = cfg.Collection + ClaimsSuffix
	cfg.URI = u.start(t)
	core, logs := observer.New(zapcore.InfoLevel)
	s := openStore(t, cfg, WithLogger(zap.New(core)))
	if !s.setupDone.Load() {
		t.Fatal("the store did not finish its start-up")
	}
	return s, logs
}

// TestClaimsTTLIndexDroppedAtStart: a deployment upgraded from a version
// that made the claims' {at: 1} index a TTL index has it dropped at start
// and replaced by a plain one, in that order.
func TestClaimsTTLIndexDroppedAtStart(t *testing.T) {
	t.Parallel()
	u := &upgradedMongo{}
	s, logs := openUpgraded(t, u)

	drop, create := -1, -1
	for i, c := range u.commands("") {
		switch {
		case c.Lookup("dropIndexes").Type != 0:
			if c.Lookup("dropIndexes").StringValue() != u.claims || c.Lookup("index").StringValue() != "at_1" {
				t.Errorf("dropped something else than %s's at_1: %v", u.claims, c)
			}
			drop = i
		case c.Lookup("createIndexes").Type != 0 && c.Lookup("createIndexes").StringValue() == u.claims:
			keys, _ := c.Lookup("indexes", "0", "key").DocumentOK()
			if !isAtKey(keys) {
				continue
			}
			if _, err := c.LookupErr("indexes", "0", "expireAfterSeconds"); err == nil {
				t.Errorf("created a TTL index on the claims: %v", c)
			}
			if create < 0 {
				create = i
			}
		}
	}
	if drop < 0 || create < 0 || create < drop {
		t.Fatalf("want dropIndexes at_1 then createIndexes {at: 1} on %s; got drop at %d, create at %d", u.claims, drop, create)
	}
	if logs.FilterMessageSnippet("dropped").FilterLevelExact(zapcore.InfoLevel).Len() != 1 {
		t.Errorf("want one Info log of the drop; got %v", logs.All())
	}
	if logs.FilterLevelExact(zapcore.ErrorLevel).Len() != 0 {
		t.Errorf("errors logged: %v", logs.FilterLevelExact(zapcore.ErrorLevel).All())
	}
	if n := testutil.ToFloat64(s.m.claimsTTL); n != 0 {
		t.Errorf("lockgate_lockstore_claims_ttl_indexes = %v after the drop", n)
	}
}

// TestClaimsTTLIndexDropRefused: a user without the privilege to drop the
// index still gets a working store, and an Error that tells the operator
// what to run and why.
func TestClaimsTTLIndexDropRefused(t *testing.T) {
	t.Parallel()
	u := &upgradedMongo{dropRefusal: mongoerr.New(mongoerr.Unauthorized, "not authorized on lockgate_test to execute command { dropIndexes }")}
	s, logs := openUpgraded(t, u)

	if len(u.commands("dropIndexes")) == 0 {
		t.Fatal("no dropIndexes sent")
	}
	errs := logs.FilterLevelExact(zapcore.ErrorLevel).All()
	if len(errs) != 1 {
		t.Fatalf("want one Error log; got %v", logs.All())
	}
	want := `db.` + u.claims + `.dropIndex("at_1")`
	t.Logf("logged: %s", errs[0].Message)
	if msg := errs[0].Message; !strings.Contains(msg, want) || !strings.Contains(msg, "head") {
		t.Errorf("the Error log does not say what to run (%s) and why: %q", want, msg)
	}
	if n := testutil.ToFloat64(s.m.claimsTTL); n != 1 {
		t.Errorf("lockgate_lockstore_claims_ttl_indexes = %v, want 1", n)
	}
	for _, c := range u.commands("createIndexes") {
		if c.Lookup("createIndexes").StringValue() == u.claims {
			t.Errorf("asked for an index of the key the TTL index still has: %v", c)
		}
	}
	if err := s.Ping(context.Background()); err != nil {
		t.Errorf("ping: %v", err)
	}
}

// TestClaimsTTLIndexMadeAgainMeanwhile: between the drop and the plain
// create, an older lockgate starting on the same store can make its TTL
// index again; the refused create (an index of that name with other
// options) is reported like a refused drop.
func TestClaimsTTLIndexMadeAgainMeanwhile(t *testing.T) {
	t.Parallel()
	u := &upgradedMongo{createRefusal: mongoerr.New(mongoerr.IndexOptionsConflict, "An existing index has the same name as the requested index. Requested index: { v: 2, key: { at: 1 }, name: \"at_1\" }")}
	s, logs := openUpgraded(t, u)

	errs := logs.FilterLevelExact(zapcore.ErrorLevel).All()
	if len(errs) != 1 || !strings.Contains(errs[0].Message, `db.`+u.claims+`.dropIndex("at_1")`) {
		t.Fatalf("want one Error log saying what to run; got %v", logs.All())
	}
	if n := testutil.ToFloat64(s.m.claimsTTL); n != 1 {
		t.Errorf("lockgate_lockstore_claims_ttl_indexes = %v, want 1", n)
	}
}
