package scheme

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

// TestLockOf: the lock a document shows, and why one cannot be mirrored.
func TestLockOf(t *testing.T) {
	scheme := func(s *config.Scheme) policy.Scheme {
		p, err := policy.CompileWithLease(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "a.b", Mode: config.ModeEnforce, Scheme: s}}}, 30000)
		if err != nil {
			t.Fatal(err)
		}
		return p.Lookup(namespace.Of("a.b")).Scheme
	}
	hf := scheme(&config.Scheme{Type: config.SchemeHolderFields, LeaseMS: 60000})
	hfDotted := scheme(&config.Scheme{Type: config.SchemeHolderFields, LeaseMS: 60000, Field: "lock.id", TimeField: "lock.at"})
	ld := scheme(&config.Scheme{Type: config.SchemeLockDocument})
	fl := scheme(&config.Scheme{Type: config.SchemeFlag})
	now := time.Now()
	date := func(d time.Duration) primitive.DateTime { return primitive.NewDateTimeFromTime(now.Add(d)) }
	for _, c := range []struct {
		name       string
		s          policy.Scheme
		doc        bson.D
		held, live bool
		bad        string
	}{
		{"hf free", hf, bson.D{{"LockId", nil}, {"LockTime", date(0)}}, false, false, ""},
		{"hf live", hf, bson.D{{"LockId", "g"}, {"LockTime", date(-time.Second)}}, true, true, ""},
		{"hf expired", hf, bson.D{{"LockId", "g"}, {"LockTime", date(-2 * time.Minute)}}, true, false, ""},
		{"hf time a string", hf, bson.D{{"LockId", "g"}, {"LockTime", "now"}}, true, true, "LockTime is of type string"},
		{"hf no time", hf, bson.D{{"LockId", "g"}}, true, true, "LockTime is missing"},
		{"hf holder an array", hf, bson.D{{"LockId", bson.A{"g"}}, {"LockTime", date(0)}}, true, true, "is of type array"},
		{"hf dotted under an array", hfDotted, bson.D{{"lock", bson.A{bson.D{{"id", "g"}}}}}, true, true, "lock is an array"},
		{"ld live", ld, bson.D{{"Lock", bson.D{{"actor", "a"}, {"expiresAt", date(time.Minute)}}}}, true, true, ""},
		{"ld released leaving an error", ld, bson.D{{"Lock", bson.D{{"actor", nil}, {"expiresAt", date(time.Minute)}, {"error", "x"}}}}, false, false, ""},
		{"ld expiry a number", ld, bson.D{{"Lock", bson.D{{"actor", "a"}, {"expiresAt", now.UnixMilli()}}}}, true, true, "expiresAt is of type 64-bit integer"},
		{"ld lock no document", ld, bson.D{{"Lock", 5}}, true, true, "Lock is of type 32-bit integer"},
		{"flag set", fl, bson.D{{"locked", true}}, true, true, ""},
		{"flag 1", fl, bson.D{{"locked", 1}}, false, false, ""},
	} {
		raw, err := bson.Marshal(c.doc)
		if err != nil {
			t.Fatal(err)
		}
		d := lockOf(c.s, bsoncore.Document(raw))
		if (d.holder.Type != 0) != c.held || d.live(now) != c.live || (c.bad == "") != (d.bad == "") || !strings.Contains(d.bad, c.bad) {
			t.Errorf("%s: lockOf = holder %v, live %v, bad %q; want held %v, live %v, bad %q", c.name, d.holder, d.live(now), d.bad, c.held, c.live, c.bad)
		}
	}
}

// docsReader answers LockFields from a list of documents, one per read
// (the last one again once they run out).
type docsReader struct {
	docs []bson.D
	n    int
}

func (r *docsReader) LockFields(context.Context, namespace.Namespace, docid.ID, []string) (bsoncore.Document, bool, error) {
	d := r.docs[min(r.n, len(r.docs)-1)]
	r.n++
	raw, err := bson.Marshal(d)
	return bsoncore.Document(raw), true, err
}

// TestSchemeAdoptRacingRelease: the document showed a live lock when it
// was read, and its holder released it (through another proxy) before the
// adoption: the adopted mirror must not outlive the lock it mirrors.
func TestSchemeAdoptRacingRelease(t *testing.T) {
	pol, err := policy.CompileWithLease(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{
		{Match: "shop.ld", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockDocument}},
	}}, 30000)
	if err != nil {
		t.Fatal(err)
	}
	r := pol.Lookup(namespace.Of("shop.ld"))
	live := bson.D{{"Lock", bson.D{{"actor", "k"}, {"expiresAt", primitive.NewDateTimeFromTime(time.Now().Add(time.Minute))}}}}
	for _, c := range []struct {
		name  string
		again bson.D
		held  bool
	}{
		{"released meanwhile", bson.D{{"Lock", nil}}, false},
		{"still held", live, true},
	} {
		store := memstore.New(memstore.Config{})
		g := New(Config{Store: store, Reader: &docsReader{docs: []bson.D{live, c.again}}, Log: zap.NewNop(),
			SessionKey: func(user string, b []byte) []byte { return append([]byte(user+"\x00"), b...) }})
		req := &proxy.Request{Client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000", RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}}}
		id := lockstoretest.ID(1)
		ctx := context.Background()
		d, err := g.readDocLock(ctx, r.Scheme, namespace.Of("shop.ld"), id)
		if err != nil || !d.live(time.Now()) {
			t.Fatalf("%s: first read %+v, %v", c.name, d, err)
		}
		if err := g.adoptDocLock(ctx, req, r, namespace.Of("shop.ld"), id, d); err != nil {
			t.Fatalf("%s: adopt: %v", c.name, err)
		}
		o, _ := g.owner(req, namespace.Of("shop.ld"), r.Scheme, d.holder)
		sts, err := store.Status(ctx, o, namespace.Of("shop.ld"), []docid.ID{id})
		if err != nil || len(sts) != 1 || sts[0].Held != c.held {
			t.Errorf("%s: mirror %+v, %v; want held %v", c.name, sts, err, c.held)
		}
	}
}
