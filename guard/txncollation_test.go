package guard

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/testserver/scripted"
)

// caseInsensitiveOrders is a resolver that reports shop.orders's default
// collation as not simple (a case-insensitive one), every other's as
// simple, as the scripted router has no listCollections to read them
// from.
type caseInsensitiveOrders struct{ Resolver }

func (caseInsensitiveOrders) SimpleCollation(_ context.Context, ns namespace.Namespace) (bool, error) {
	return ns.String() != "shop.orders", nil
}

// Candidates: no document matches (an upsert inserts).
func (caseInsensitiveOrders) Candidates(context.Context, namespace.Namespace, bsoncore.Document, bsoncore.Document, bsoncore.Value, int) ([]docid.ID, error) {
	return nil, nil
}

// lockString is s's acquireLock of string _id id in shop.orders.
func (s txnSession) lockString(t *testing.T, p *stack, id string) {
	t.Helper()
	if r := s.cmd(t, p, bson.D{{"acquireLock", "orders"}, {"ids", bson.A{id}}, {"leaseMS", 30000}, {"$db", "shop"}}); !okReply(r) {
		t.Fatalf("acquireLock %q: %v", id, r)
	}
}

func txnInsertOf(id any, n int64) bson.D {
	return bson.D{{"insert", "orders"}, {"documents", bson.A{bson.D{{"_id", id}}}},
		{"txnNumber", n}, {"autocommit", false}, {"startTransaction", true}, {"$db", "shop"}}
}

// TestCommitOfAnInsertOfANowLockedCaseVariantIsChecked: in shop.orders,
// whose default collation (and so its _id index's) ignores case, session
// A inserts {_id: "C"} in a transaction; nothing is locked then, so the
// statement is allowed. Before the commit, session B locks "c" to create
// it (lock, then upsert). Committing A's insert would create the document
// B locked, as a plain insert of "C" may not (docs/SECURITY.md, "Insert
// the _id another session has locked"): the commit is refused and the
// transaction aborted. The commit re-checked the inserted _ids exactly
// only before, and this commit was executed. An insert of a string _id
// into a collection under the simple collation, or of one no lock
// resembles, still commits.
func TestCommitOfAnInsertOfANowLockedCaseVariantIsChecked(t *testing.T) {
	u := &txnUpstream{}
	up, err := scripted.Start(u.handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	p := startStackWith(t, stackOptions{upstreamAddr: up.Addr(),
		memStore: memstore.New(memstore.Config{DefaultLease: 5 * time.Second, MaxLease: time.Minute}),
		resolver: func(r Resolver) Resolver { return caseInsensitiveOrders{r} },
		policy: config.Policy{Default: config.ModeOff, LeaseMarginMS: 100, Namespaces: []config.NamespaceRule{
			{Match: "shop.orders", Mode: config.ModeEnforce}, {Match: "shop.items", Mode: config.ModeEnforce}}}})
	a, b := newTxnSession(0xc1), newTxnSession(0xc2)

	wantOK(t, "insert of \"C\" in the transaction", a.cmd(t, p, txnInsertOf("C", 1)))
	b.lockString(t, p, "c")
	r := a.cmd(t, p, endCmd("commitTransaction", 1))
	wantCommitRefused(t, u, r, 1)
	if msg, _ := r["errmsg"].(string); !strings.Contains(msg, "default collation") {
		t.Errorf("errmsg %q, want the collation named", msg)
	}

	// shop.items's collation is simple: "C" there is not "c".
	if r := b.cmd(t, p, bson.D{{"acquireLock", "items"}, {"ids", bson.A{"c"}}, {"leaseMS", 30000}, {"$db", "shop"}}); !okReply(r) {
		t.Fatalf("acquireLock \"c\" in items: %v", r)
	}
	items := txnInsertOf("C", 2)
	items[0].Value = "items"
	wantOK(t, "insert of \"C\" into items in the transaction", a.cmd(t, p, items))
	wantCommitted(t, u, a.cmd(t, p, endCmd("commitTransaction", 2)), 2)

	// Once B released "c", A's insert of "C" commits.
	if r := b.cmd(t, p, bson.D{{"releaseLock", "orders"}, {"ids", bson.A{"c"}}, {"$db", "shop"}}); !okReply(r) {
		t.Fatalf("releaseLock \"c\": %v", r)
	}
	wantOK(t, "insert of \"C\" in the transaction", a.cmd(t, p, txnInsertOf("C", 3)))
	wantCommitted(t, u, a.cmd(t, p, endCmd("commitTransaction", 3)), 3)

	// An upsert of "D" under A's lock on "D" inserts it when nothing
	// matches: B's lock on "d", taken since, refuses its commit too.
	a.lockString(t, p, "D")
	upsert := bson.D{{"update", "orders"}, {"updates", bson.A{bson.D{{"q", bson.D{{"_id", "D"}}}, {"u", bson.D{{"$set", bson.D{{"n", 1}}}}}, {"upsert", true}}}},
		{"txnNumber", int64(4)}, {"autocommit", false}, {"startTransaction", true}, {"$db", "shop"}}
	wantOK(t, "upsert of \"D\" in the transaction", a.cmd(t, p, upsert))
	b.lockString(t, p, "d")
	wantCommitRefused(t, u, a.cmd(t, p, endCmd("commitTransaction", 4)), 4)
}
