package enforcement

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/wire"
)

// The gateway's lock store: config.Default's database and collection.
const (
	lockDB     = "lockgate"
	lockColl   = "locks"
	claimsColl = "locks_claims"
)

func goClient(t *testing.T, uri string) *mongo.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := mongo.Connect(ctx, options.Client().ApplyURI(uri).SetAppName("sealed-attacker"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Disconnect(context.Background()) })
	return c
}

// lockStoreSnapshot reads every lock store document directly, as canonical
// extended JSON in _id order: the bytes an attack must leave unchanged.
func lockStoreSnapshot(t *testing.T, direct *mongo.Client) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	for _, coll := range []string{lockColl, claimsColl} {
		cur, err := direct.Database(lockDB).Collection(coll).Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
		if err != nil {
			t.Fatalf("snapshot %s: %v", coll, err)
		}
		for cur.Next(ctx) {
			b.WriteString(coll + ": " + cur.Current.String() + "\n")
		}
		if err := cur.Err(); err != nil {
			t.Fatal(err)
		}
		cur.Close(ctx)
	}
	return b.String()
}

// wantUnauthorized requires err to be lockgate's refusal of a reserved
// namespace: code 13 with reason "reserved".
func wantUnauthorized(t *testing.T, attack string, err error) {
	t.Helper()
	var se mongo.ServerError
	if !errors.As(err, &se) {
		t.Errorf("%s: got %v, want lockgate's Unauthorized (13) refusal", attack, err)
		return
	}
	if !se.HasErrorCode(13) || !strings.Contains(err.Error(), "reserved for the lock store") {
		t.Errorf("%s: got %v, want code 13 naming the lock store", attack, err)
	}
}

// TestLockStoreIsSealed: through the proxy no client command reads or
// writes the lock store's namespaces, in any form (issue 10, item 1). A
// victim holds a lock; an attacker with no lock tries to read the lock
// records (to learn the holder's lsid and write as the holder), delete or
// forge them, or reach them through another collection, a view, a rename,
// an aggregation stage, another database, a case or Unicode variant of the
// names, a legacy opcode or compression. Every attempt is refused with
// Unauthorized (13), the lock store is byte-for-byte unchanged, and the
// victim's lock still protects its document.
func TestLockStoreIsSealed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	direct := goClient(t, directURI)
	victim := goClient(t, proxyURI)
	attacker := goClient(t, proxyURI)

	protected := direct.Database("shop").Collection("protected")
	if _, err := protected.InsertOne(ctx, bson.D{{Key: "_id", Value: "sealed-1"}, {Key: "v", Value: 0}}); err != nil && !mongo.IsDuplicateKeyError(err) {
		t.Fatal(err)
	}
	sess, err := victim.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(ctx)
	sctx := mongo.NewSessionContext(ctx, sess)
	if err := victim.Database("shop").RunCommand(sctx, bson.D{{Key: "acquireLock", Value: "protected"}, {Key: "ids", Value: bson.A{"sealed-1"}}, {Key: "leaseMS", Value: 60000}}).Err(); err != nil {
		t.Fatalf("victim acquireLock: %v", err)
	}
	before := lockStoreSnapshot(t, direct)
	if !strings.Contains(before, "sealed-1") {
		t.Fatalf("the victim's lock is not in the lock store:\n%s", before)
	}

	lg := attacker.Database(lockDB)
	shop := attacker.Database("shop")
	admin := attacker.Database("admin")
	cmd := func(db *mongo.Database, c bson.D) error { return db.RunCommand(ctx, c).Err() }
	pipeline := func(stages ...bson.D) bson.D {
		return bson.D{{Key: "aggregate", Value: "protected"}, {Key: "pipeline", Value: stages}, {Key: "cursor", Value: bson.D{}}}
	}
	dbColl := func(db, coll string) bson.D { return bson.D{{Key: "db", Value: db}, {Key: "coll", Value: coll}} }
	attacks := []struct {
		name string
		run  func() error
	}{
		{"find the lock records", func() error { _, err := lg.Collection(lockColl).Find(ctx, bson.D{}); return err }},
		{"find the claims", func() error { _, err := lg.Collection(claimsColl).Find(ctx, bson.D{}); return err }},
		{"count", func() error { _, err := lg.Collection(lockColl).CountDocuments(ctx, bson.D{}); return err }},
		{"distinct owners", func() error { return cmd(lg, bson.D{{Key: "distinct", Value: lockColl}, {Key: "key", Value: "owner"}}) }},
		{"aggregate on the lock collection", func() error { _, err := lg.Collection(lockColl).Aggregate(ctx, bson.A{}); return err }},
		{"delete the victim's lock", func() error { _, err := lg.Collection(lockColl).DeleteMany(ctx, bson.D{}); return err }},
		{"delete the claims", func() error { _, err := lg.Collection(claimsColl).DeleteMany(ctx, bson.D{}); return err }},
		{"update the lock records", func() error {
			_, err := lg.Collection(lockColl).UpdateMany(ctx, bson.D{}, bson.D{{Key: "$set", Value: bson.D{{Key: "expiresAt", Value: time.Unix(0, 0)}}}})
			return err
		}},
		{"forge a lock record", func() error {
			_, err := lg.Collection(lockColl).InsertOne(ctx, bson.D{{Key: "forged", Value: true}})
			return err
		}},
		{"findAndModify", func() error {
			return lg.Collection(claimsColl).FindOneAndDelete(ctx, bson.D{}).Err()
		}},
		{"drop the lock collection", func() error { return lg.Collection(lockColl).Drop(ctx) }},
		{"drop the lock database", func() error { return lg.Drop(ctx) }},
		{"index the lock collection", func() error {
			_, err := lg.Collection(lockColl).Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "x", Value: 1}}})
			return err
		}},
		{"rename the lock collection away", func() error {
			return cmd(admin, bson.D{{Key: "renameCollection", Value: "lockgate.locks"}, {Key: "to", Value: "shop.stolen"}})
		}},
		{"rename over the lock collection", func() error {
			return cmd(admin, bson.D{{Key: "renameCollection", Value: "shop.protected"}, {Key: "to", Value: "lockgate.locks"}, {Key: "dropTarget", Value: true}})
		}},
		{"a view on the lock collection", func() error {
			return cmd(lg, bson.D{{Key: "create", Value: "peek"}, {Key: "viewOn", Value: lockColl}, {Key: "pipeline", Value: bson.A{}}})
		}},
		{"$lookup from another database", func() error {
			return cmd(shop, pipeline(bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: dbColl(lockDB, lockColl)}, {Key: "pipeline", Value: bson.A{}}, {Key: "as", Value: "l"}}}}))
		}},
		{"$unionWith nested in $facet", func() error {
			return cmd(shop, pipeline(bson.D{{Key: "$facet", Value: bson.D{{Key: "f", Value: bson.A{bson.D{{Key: "$unionWith", Value: dbColl(lockDB, claimsColl)}}}}}}}))
		}},
		{"$out into the lock collection", func() error {
			return cmd(shop, pipeline(bson.D{{Key: "$out", Value: dbColl(lockDB, lockColl)}}))
		}},
		{"$merge into the lock collection", func() error {
			return cmd(shop, pipeline(bson.D{{Key: "$merge", Value: bson.D{{Key: "into", Value: dbColl(lockDB, lockColl)}}}}))
		}},
		{"explain a find", func() error {
			return cmd(lg, bson.D{{Key: "explain", Value: bson.D{{Key: "find", Value: lockColl}}}})
		}},
		{"bulkWrite with nsInfo", func() error {
			return cmd(admin, bson.D{{Key: "bulkWrite", Value: 1}, {Key: "ops", Value: bson.A{bson.D{{Key: "delete", Value: 0}, {Key: "filter", Value: bson.D{}}, {Key: "multi", Value: true}}}},
				{Key: "nsInfo", Value: bson.A{bson.D{{Key: "ns", Value: "lockgate.locks"}}}}})
		}},
		{"applyOps", func() error {
			return cmd(admin, bson.D{{Key: "applyOps", Value: bson.A{bson.D{{Key: "op", Value: "d"}, {Key: "ns", Value: "lockgate.locks"}, {Key: "o", Value: bson.D{}}}}}})
		}},
		{"acquireLock on the lock collection", func() error {
			return cmd(lg, bson.D{{Key: "acquireLock", Value: lockColl}, {Key: "ids", Value: bson.A{"x"}}})
		}},
		{"case variant of the collection", func() error { _, err := lg.Collection("LOCKS").DeleteMany(ctx, bson.D{}); return err }},
		{"case variant of the database", func() error {
			_, err := attacker.Database("LockGate").Collection(lockColl).Find(ctx, bson.D{})
			return err
		}},
		{"full-width Unicode variant", func() error { _, err := lg.Collection("ｌｏｃｋｓ").Find(ctx, bson.D{}); return err }},
		// Forms that name the collection in less common positions.
		{"getMore on a lock store cursor", func() error {
			return cmd(lg, bson.D{{Key: "getMore", Value: int64(4242)}, {Key: "collection", Value: lockColl}})
		}},
		{"killCursors on the lock collection", func() error {
			return cmd(lg, bson.D{{Key: "killCursors", Value: lockColl}, {Key: "cursors", Value: bson.A{int64(4242)}}})
		}},
		{"listIndexes", func() error { _, err := lg.Collection(lockColl).Indexes().List(ctx); return err }},
		{"collStats", func() error { return cmd(lg, bson.D{{Key: "collStats", Value: lockColl}}) }},
		{"dataSize from another database", func() error { return cmd(shop, bson.D{{Key: "dataSize", Value: "lockgate.locks"}}) }},
		{"validate", func() error { return cmd(lg, bson.D{{Key: "validate", Value: lockColl}}) }},
		{"compact", func() error { return cmd(lg, bson.D{{Key: "compact", Value: claimsColl}}) }},
		{"collMod", func() error {
			return cmd(lg, bson.D{{Key: "collMod", Value: lockColl}, {Key: "validator", Value: bson.D{}}})
		}},
		{"$collStats", func() error {
			return cmd(lg, bson.D{{Key: "aggregate", Value: lockColl}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$collStats", Value: bson.D{{Key: "count", Value: bson.D{}}}}}}}, {Key: "cursor", Value: bson.D{}}})
		}},
		{"aggregate: 1 on the lock database", func() error {
			return cmd(lg, bson.D{{Key: "aggregate", Value: 1}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$documents", Value: bson.A{bson.D{}}}}}}, {Key: "cursor", Value: bson.D{}}})
		}},
		{"dbHash of the lock database", func() error { return cmd(lg, bson.D{{Key: "dbHash", Value: 1}}) }},
		{"a view elsewhere whose pipeline looks up the lock collection", func() error {
			return cmd(shop, bson.D{{Key: "create", Value: "peek"}, {Key: "viewOn", Value: "protected"}, {Key: "pipeline", Value: bson.A{
				bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: dbColl(lockDB, lockColl)}, {Key: "pipeline", Value: bson.A{}}, {Key: "as", Value: "l"}}}}}}})
		}},
		{"$graphLookup from another database", func() error {
			return cmd(shop, pipeline(bson.D{{Key: "$graphLookup", Value: bson.D{{Key: "from", Value: dbColl(lockDB, lockColl)}, {Key: "startWith", Value: "$_id"},
				{Key: "connectFromField", Value: "_id"}, {Key: "connectToField", Value: "_id"}, {Key: "as", Value: "l"}}}}))
		}},
		{"$unionWith inside a $lookup sub-pipeline", func() error {
			return cmd(shop, pipeline(bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "protected"}, {Key: "as", Value: "l"},
				{Key: "pipeline", Value: bson.A{bson.D{{Key: "$unionWith", Value: bson.D{{Key: "coll", Value: lockColl}, {Key: "db", Value: lockDB}}}}}}}}}))
		}},
		{"mapReduce reading the lock collection", func() error {
			return cmd(lg, bson.D{{Key: "mapReduce", Value: lockColl}, {Key: "map", Value: "function() { emit(this._id, 1) }"},
				{Key: "reduce", Value: "function(k, v) { return 1 }"}, {Key: "out", Value: bson.D{{Key: "inline", Value: 1}}}})
		}},
		{"mapReduce output into the lock collection", func() error {
			return cmd(shop, bson.D{{Key: "mapReduce", Value: "protected"}, {Key: "map", Value: "function() { emit(this._id, 1) }"},
				{Key: "reduce", Value: "function(k, v) { return 1 }"}, {Key: "out", Value: bson.D{{Key: "replace", Value: lockColl}, {Key: "db", Value: lockDB}}}})
		}},
		{"a change stream on the whole deployment", func() error {
			return cmd(admin, bson.D{{Key: "aggregate", Value: 1}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$changeStream", Value: bson.D{{Key: "allChangesForCluster", Value: true}}}}}}, {Key: "cursor", Value: bson.D{}}})
		}},
		{"applyOps dropping the lock database", func() error {
			return cmd(admin, bson.D{{Key: "applyOps", Value: bson.A{bson.D{{Key: "op", Value: "c"}, {Key: "ns", Value: "lockgate.$cmd"}, {Key: "o", Value: bson.D{{Key: "dropDatabase", Value: 1}}}}}}})
		}},
		{"applyOps precondition on the lock collection", func() error {
			return cmd(admin, bson.D{{Key: "applyOps", Value: bson.A{}}, {Key: "preCondition", Value: bson.A{bson.D{{Key: "ns", Value: "lockgate.locks"}, {Key: "q", Value: bson.D{}}, {Key: "res", Value: bson.D{}}}}}})
		}},
		{"eval from another database", func() error {
			return cmd(shop, bson.D{{Key: "eval", Value: "db.getSiblingDB('lockgate').locks.findOne()"}})
		}},
		{"$lookup naming from twice (the server reads the last)", func() error {
			return cmd(shop, pipeline(bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "protected"}, {Key: "from", Value: dbColl(lockDB, lockColl)}, {Key: "pipeline", Value: bson.A{}}, {Key: "as", Value: "l"}}}}))
		}},
		{"$lookup with a second pipeline", func() error {
			return cmd(shop, pipeline(bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "protected"}, {Key: "as", Value: "l"}, {Key: "pipeline", Value: bson.A{}},
				{Key: "pipeline", Value: bson.A{bson.D{{Key: "$unionWith", Value: dbColl(lockDB, lockColl)}}}}}}}))
		}},
		{"case variant of the whole namespace in renameCollection", func() error {
			return cmd(admin, bson.D{{Key: "renameCollection", Value: "LOCKGATE.Locks_Claims"}, {Key: "to", Value: "shop.stolen"}})
		}},
	}
	for _, a := range attacks {
		wantUnauthorized(t, a.name, a.run())
	}

	// The same reads in the forms old drivers and compressing clients send.
	for _, raw := range legacyAttacks(t) {
		reply := roundTrip(t, raw.msg)
		if code, _ := reply.Lookup("code").AsInt64OK(); code != 13 || !strings.Contains(reply.String(), "reserved for the lock store") {
			t.Errorf("%s: reply %v, want the Unauthorized refusal", raw.name, reply)
		}
	}

	// Legacy writes and OP_GET_MORE: the writes have no reply, so their
	// refusal closes the connection; each must be counted as a lock store
	// refusal (FerretDB would drop them too, so the count is what tells).
	for _, raw := range legacyWrites() {
		n := metricValue(t, "lockgate_reserved_refusals_total", map[string]string{"what": "lock_store"})
		reply, closed := sendRaw(t, raw.msg)
		if closed == (reply != nil) {
			t.Errorf("%s: reply %v, connection closed %v", raw.name, reply, closed)
		}
		if reply != nil {
			if code, _ := reply.Lookup("code").AsInt64OK(); code != 13 {
				t.Errorf("%s: reply %v, want the Unauthorized refusal", raw.name, reply)
			}
		}
		if got := metricValue(t, "lockgate_reserved_refusals_total", map[string]string{"what": "lock_store"}); got != n+1 {
			t.Errorf("%s: lock store refusals went from %v to %v, want one more", raw.name, n, got)
		}
	}

	if after := lockStoreSnapshot(t, direct); after != before {
		t.Errorf("the lock store changed under the attacks:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// The victim's lock still guards the document: the attacker's write is
	// refused, the victim's own goes through.
	_, err = attacker.Database("shop").Collection("protected").UpdateOne(ctx, bson.D{{Key: "_id", Value: "sealed-1"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: -1}}}})
	if se := (mongo.ServerError)(nil); !errors.As(err, &se) || !se.HasErrorCode(46) {
		t.Errorf("attacker's write after the attacks: %v, want LockBusy (46)", err)
	}
	if _, err := victim.Database("shop").Collection("protected").UpdateOne(sctx, bson.D{{Key: "_id", Value: "sealed-1"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "v", Value: 1}}}}); err != nil {
		t.Errorf("victim's write under its lock: %v", err)
	}
}

type rawAttack struct {
	name string
	msg  []byte
}

// legacyAttacks are lock store reads as OP_QUERY (a legacy find and a
// legacy command), and an OP_MSG find wrapped in OP_COMPRESSED.
func legacyAttacks(t *testing.T) []rawAttack {
	t.Helper()
	find := bsoncore.NewDocumentBuilder().AppendString("find", lockColl).AppendString("$db", lockDB).Build()
	msg := wire.AppendMsg(nil, 7, 0, 0, find)
	compressed, err := wire.AppendCompressed(nil, msg, wire.CompressorZlib)
	if err != nil {
		t.Fatal(err)
	}
	empty := bsoncore.NewDocumentBuilder().Build()
	findCmd := bsoncore.NewDocumentBuilder().AppendString("find", claimsColl).Build()
	// An aggregate whose pipeline travels as a document sequence, where
	// the server reads it as the array of that name.
	agg := bsoncore.NewDocumentBuilder().AppendString("aggregate", "protected").AppendDocument("cursor", empty).AppendString("$db", "shop").Build()
	lookup := bsoncore.NewDocumentBuilder().AppendDocument("$lookup", bsoncore.NewDocumentBuilder().
		AppendDocument("from", bsoncore.NewDocumentBuilder().AppendString("db", lockDB).AppendString("coll", lockColl).Build()).
		AppendString("as", "l").Build()).Build()
	seqAgg := wire.AppendMsg(nil, 8, 0, 0, agg, wire.Sequence{Identifier: "pipeline", Documents: []bsoncore.Document{lookup}})
	return []rawAttack{
		{"OP_QUERY on the lock collection", opQuery(5, lockDB+"."+lockColl, empty)},
		{"OP_MSG pipeline in a document sequence", seqAgg},
		{"OP_QUERY command on lockgate.$cmd", opQuery(6, lockDB+".$cmd", findCmd)},
		{"OP_COMPRESSED OP_MSG find", compressed},
	}
}

// legacyWrites are OP_INSERT, OP_UPDATE and OP_DELETE on the lock
// collection, and OP_GET_MORE of a cursor on it.
func legacyWrites() []rawAttack {
	empty := bsoncore.NewDocumentBuilder().Build()
	forged := bsoncore.NewDocumentBuilder().AppendString("_id", "forged").Build()
	set := bsoncore.NewDocumentBuilder().AppendDocument("$set", bsoncore.NewDocumentBuilder().AppendInt64("expiresAt", 0).Build()).Build()
	ns := lockDB + "." + lockColl
	legacy := func(op wire.OpCode, id int32, flags uint32, docs ...bsoncore.Document) []byte {
		b := wire.Header{RequestID: id, OpCode: op}.Append(nil)
		if op != wire.OpCodeInsert {
			b = binary.LittleEndian.AppendUint32(b, 0) // ZERO
		} else {
			b = binary.LittleEndian.AppendUint32(b, flags)
		}
		b = append(append(b, ns...), 0)
		switch op {
		case wire.OpCodeUpdate, wire.OpCodeDelete:
			b = binary.LittleEndian.AppendUint32(b, flags)
		case wire.OpCodeGetMore:
			b = binary.LittleEndian.AppendUint32(b, 0) // numberToReturn
			b = binary.LittleEndian.AppendUint64(b, 4242)
		}
		for _, d := range docs {
			b = append(b, d...)
		}
		binary.LittleEndian.PutUint32(b, uint32(len(b)))
		return b
	}
	return []rawAttack{
		{"OP_INSERT of a forged lock record", legacy(wire.OpCodeInsert, 11, 0, forged)},
		{"OP_UPDATE of every lock record", legacy(wire.OpCodeUpdate, 12, 2, empty, set)},
		{"OP_DELETE of every lock record", legacy(wire.OpCodeDelete, 13, 0, empty)},
		{"OP_GET_MORE on the lock collection", legacy(wire.OpCodeGetMore, 14, 0)},
	}
}

// sendRaw sends one raw request to the proxy and returns the reply's
// first document, or closed if the proxy closed the connection instead.
func sendRaw(t *testing.T, req []byte) (reply bsoncore.Document, closed bool) {
	t.Helper()
	addr := strings.TrimSuffix(strings.TrimPrefix(proxyURI, "mongodb://"), "/")
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	raw, err := wire.ReadMessage(c, wire.NewBufferPool(), wire.Limits{})
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("no reply and the connection stayed open: %v", err)
		}
		return nil, true
	}
	defer raw.Release()
	m, err := wire.Parse(append([]byte(nil), raw.Bytes...), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := m.(*wire.OpReply); ok && len(r.Documents) > 0 {
		return r.Documents[0], false
	}
	t.Fatalf("unexpected reply %T", m)
	return nil, false
}

func opQuery(id int32, ns string, q bsoncore.Document) []byte {
	b := make([]byte, 16, 64+len(q))
	b = binary.LittleEndian.AppendUint32(b, 0) // flags
	b = append(append(b, ns...), 0)
	b = binary.LittleEndian.AppendUint32(b, 0)          // numberToSkip
	b = binary.LittleEndian.AppendUint32(b, 0xFFFFFFFF) // numberToReturn: -1, one batch
	b = append(b, q...)
	binary.LittleEndian.PutUint32(b[0:], uint32(len(b)))
	binary.LittleEndian.PutUint32(b[4:], uint32(id))
	binary.LittleEndian.PutUint32(b[12:], uint32(wire.OpCodeQuery))
	return b
}

// roundTrip sends one raw request to the proxy and returns its reply's
// body (OP_MSG) or first document (OP_REPLY).
func roundTrip(t *testing.T, req []byte) bsoncore.Document {
	t.Helper()
	addr := strings.TrimSuffix(strings.TrimPrefix(proxyURI, "mongodb://"), "/")
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	raw, err := wire.ReadMessage(c, wire.NewBufferPool(), wire.Limits{})
	if err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	b := append([]byte(nil), raw.Bytes...)
	raw.Release()
	m, err := wire.Parse(b, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	switch r := m.(type) {
	case *wire.OpMsg:
		return r.Body
	case *wire.OpReply:
		if len(r.Documents) > 0 {
			return r.Documents[0]
		}
	case *wire.OpCompressed:
		if inner, ok := r.Inner.(*wire.OpMsg); ok {
			return inner.Body
		}
	}
	t.Fatalf("unexpected reply %T", m)
	return nil
}

// TestLockStoreIsSealedForOtherDrivers: the same door, tried from pymongo
// and the Node.js driver: reading, deleting, forging and updating the lock
// records, dropping their database, a $lookup from another database,
// acquireLock on the lock collection and listing other sessions all fail
// with code 13, and the lock store is byte-for-byte unchanged.
func TestLockStoreIsSealedForOtherDrivers(t *testing.T) {
	scripts := []struct {
		name  string
		check func() error
		cmd   func(ctx context.Context) *exec.Cmd
	}{
		{"pymongo", testkit.Pymongo, func(ctx context.Context) *exec.Cmd {
			return exec.CommandContext(ctx, "/usr/bin/python3", "-c", `
import sys, pymongo
from pymongo.errors import OperationFailure
c = pymongo.MongoClient(sys.argv[1], serverSelectionTimeoutMS=10000)
look = [{"$lookup": {"from": {"db": "lockgate", "coll": "locks"}, "pipeline": [], "as": "l"}}]
for name, f in [("find", lambda: list(c.lockgate.locks.find())), ("delete", lambda: c.lockgate.locks.delete_many({})),
                ("claims", lambda: list(c.lockgate.locks_claims.find())),
                ("forge", lambda: c.lockgate.locks.insert_one({"_id": "forged"})),
                ("update", lambda: c.lockgate.locks.update_many({}, {"$set": {"expiresAt": 0}})),
                ("drop", lambda: c.drop_database("lockgate")),
                ("lookup", lambda: list(c.shop.protected.aggregate(look))),
                ("acquireLock", lambda: c.lockgate.command({"acquireLock": "locks", "ids": ["x"]})),
                ("currentOp", lambda: c.admin.command({"currentOp": 1})),
                ("listLocalSessions", lambda: list(c.admin.aggregate([{"$listLocalSessions": {}}])))]:
    try:
        f()
        print(name, "ALLOWED")
    except OperationFailure as e:
        print(name, e.code)
`, proxyURI)
		}},
		{"node", func() error {
			return testkit.NodeModule(filepath.Join("..", "compat", "node", "node_modules"), "mongodb")
		}, func(ctx context.Context) *exec.Cmd {
			c := exec.CommandContext(ctx, "node", "-e", `
const { MongoClient } = require('mongodb');
(async () => {
  const c = new MongoClient(process.argv[1], { serverSelectionTimeoutMS: 10000 });
  const look = [{ $lookup: { from: { db: 'lockgate', coll: 'locks' }, pipeline: [], as: 'l' } }];
  const tries = [['find', () => c.db('lockgate').collection('locks').find().toArray()],
                 ['delete', () => c.db('lockgate').collection('locks').deleteMany({})],
                 ['claims', () => c.db('lockgate').collection('locks_claims').find().toArray()],
                 ['forge', () => c.db('lockgate').collection('locks').insertOne({ _id: 'forged' })],
                 ['update', () => c.db('lockgate').collection('locks').updateMany({}, { $set: { expiresAt: 0 } })],
                 ['drop', () => c.db('lockgate').dropDatabase()],
                 ['lookup', () => c.db('shop').collection('protected').aggregate(look).toArray()],
                 ['acquireLock', () => c.db('lockgate').command({ acquireLock: 'locks', ids: ['x'] })],
                 ['currentOp', () => c.db('admin').command({ currentOp: 1 })],
                 ['listLocalSessions', () => c.db('admin').aggregate([{ $listLocalSessions: {} }]).toArray()]];
  for (const [name, f] of tries) {
    try { await f(); console.log(name, 'ALLOWED'); } catch (e) { console.log(name, e.code); }
  }
  await c.close();
})();
`, proxyURI)
			c.Dir = filepath.Join("..", "compat", "node")
			return c
		}},
	}
	// A lock held, so that the store has records to lose.
	direct := goClient(t, directURI)
	victim := goClient(t, proxyURI)
	sess, err := victim.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(context.Background())
	if err := victim.Database("shop").RunCommand(mongo.NewSessionContext(context.Background(), sess),
		bson.D{{Key: "acquireLock", Value: "protected"}, {Key: "ids", Value: bson.A{"sealed-drivers"}}, {Key: "leaseMS", Value: 60000}}).Err(); err != nil {
		t.Fatal(err)
	}
	before := lockStoreSnapshot(t, direct)
	for _, s := range scripts {
		t.Run(s.name, func(t *testing.T) {
			testkit.RequireTool(t, s.name, s.check())
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := s.cmd(ctx).CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			want := "find 13\ndelete 13\nclaims 13\nforge 13\nupdate 13\ndrop 13\nlookup 13\nacquireLock 13\ncurrentOp 13\nlistLocalSessions 13"
			if got := string(bytes.TrimSpace(out)); got != want {
				t.Errorf("got:\n%s\nwant:\n%s", got, want)
			}
			if after := lockStoreSnapshot(t, direct); after != before {
				t.Errorf("the lock store changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// TestSessionIntrospectionRefused: while a namespace is enforced, nothing
// lists other clients' session ids through the proxy (issue 10, item 6): on
// a deployment without authentication (this one) a listed lsid could be
// replayed to write as a lock holder. Killing one's own session still
// reaches the server.
func TestSessionIntrospectionRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := goClient(t, proxyURI)
	admin, cfg := c.Database("admin"), c.Database("config")
	agg := func(coll any, stage string) bson.D {
		return bson.D{{Key: "aggregate", Value: coll}, {Key: "pipeline", Value: bson.A{bson.D{{Key: stage, Value: bson.D{}}}}}, {Key: "cursor", Value: bson.D{}}}
	}
	attacks := []struct {
		name string
		db   *mongo.Database
		cmd  bson.D
	}{
		{"currentOp", admin, bson.D{{Key: "currentOp", Value: 1}}},
		{"$currentOp", admin, agg(1, "$currentOp")},
		{"$listLocalSessions", admin, agg(1, "$listLocalSessions")},
		{"$listSessions", cfg, agg("system.sessions", "$listSessions")},
		{"$currentOp in a $facet", admin, bson.D{{Key: "aggregate", Value: 1}, {Key: "pipeline", Value: bson.A{
			bson.D{{Key: "$documents", Value: bson.A{bson.D{}}}},
			bson.D{{Key: "$facet", Value: bson.D{{Key: "x", Value: bson.A{bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: bson.D{{Key: "db", Value: "config"}, {Key: "coll", Value: "system.sessions"}}}, {Key: "pipeline", Value: bson.A{}}, {Key: "as", Value: "s"}}}}}}}}},
		}}, {Key: "cursor", Value: bson.D{}}}},
		{"find config.system.sessions", cfg, bson.D{{Key: "find", Value: "system.sessions"}}},
		{"killAllSessions", admin, bson.D{{Key: "killAllSessions", Value: bson.A{}}}},
		{"killAllSessionsByPattern", admin, bson.D{{Key: "killAllSessionsByPattern", Value: bson.A{}}}},
		{"killSessions of another session", admin, bson.D{{Key: "killSessions", Value: bson.A{bson.D{{Key: "id", Value: primitiveUUID(1)}}}}}},
		// Where else session ids are kept: slow operations in the log,
		// the profiler, the retryable write and transaction tables, the
		// oplog.
		{"getLog global", admin, bson.D{{Key: "getLog", Value: "global"}}},
		{"find system.profile", c.Database("shop"), bson.D{{Key: "find", Value: "system.profile"}}},
		{"find config.transactions", cfg, bson.D{{Key: "find", Value: "transactions"}}},
		{"aggregate config.image_collection", cfg, bson.D{{Key: "aggregate", Value: "image_collection"}, {Key: "pipeline", Value: bson.A{}}, {Key: "cursor", Value: bson.D{}}}},
		{"find local.oplog.rs", c.Database("local"), bson.D{{Key: "find", Value: "oplog.rs"}}},
		{"$lookup from the oplog", c.Database("shop"), bson.D{{Key: "aggregate", Value: "protected"}, {Key: "pipeline", Value: bson.A{
			bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: bson.D{{Key: "db", Value: "local"}, {Key: "coll", Value: "oplog.rs"}}}, {Key: "pipeline", Value: bson.A{}}, {Key: "as", Value: "o"}}}}}}, {Key: "cursor", Value: bson.D{}}}},
	}
	for _, a := range attacks {
		err := a.db.RunCommand(ctx, a.cmd).Err()
		var se mongo.ServerError
		if !errors.As(err, &se) || !se.HasErrorCode(13) || !strings.Contains(err.Error(), "allowSessionIntrospection") {
			t.Errorf("%s: got %v, want lockgate's Unauthorized (13) naming policy.allowSessionIntrospection", a.name, err)
		}
	}

	// A pipeline sent as a document sequence is still a pipeline.
	empty := bsoncore.NewDocumentBuilder().Build()
	aggOne := bsoncore.NewDocumentBuilder().AppendInt32("aggregate", 1).AppendDocument("cursor", empty).AppendString("$db", "admin").Build()
	stage := bsoncore.NewDocumentBuilder().AppendDocument("$listLocalSessions", empty).Build()
	reply := roundTrip(t, wire.AppendMsg(nil, 9, 0, 0, aggOne, wire.Sequence{Identifier: "pipeline", Documents: []bsoncore.Document{stage}}))
	if code, _ := reply.Lookup("code").AsInt64OK(); code != 13 || !strings.Contains(reply.String(), "allowSessionIntrospection") {
		t.Errorf("$listLocalSessions in a pipeline document sequence: %v, want the Unauthorized refusal", reply)
	}
	// The names of the logs reveal nothing.
	if err := admin.RunCommand(ctx, bson.D{{Key: "getLog", Value: "*"}}).Err(); err != nil && strings.Contains(err.Error(), "allowSessionIntrospection") {
		t.Errorf("getLog: \"*\" was refused: %v", err)
	}
	// The caller's own session is its own business: it reaches the server.
	sess, err := c.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(ctx)
	sctx := mongo.NewSessionContext(ctx, sess)
	own := sess.ID().Lookup("id")
	err = admin.RunCommand(sctx, bson.D{{Key: "killSessions", Value: bson.A{bson.D{{Key: "id", Value: own}}}}}).Err()
	if err != nil && strings.Contains(err.Error(), "allowSessionIntrospection") {
		t.Errorf("killSessions of the caller's own session was refused: %v", err)
	}
}

func primitiveUUID(b byte) bson.RawValue {
	id := bytes.Repeat([]byte{b}, 16)
	return bson.RawValue{Type: bson.TypeBinary, Value: bsoncore.AppendBinary(nil, 4, id)}
}

// TestRefusalsAreNoOracle: the Go driver's form of issue 10's oracle (the
// pymongo, Node.js and mongosh forms are checkNoOracle in
// TestEnforcementWithRealDrivers). An attacker without locks sends writes
// whose filters probe a field it wants to learn; each is refused, and no
// refusal names a matching _id or the holder of a matching document, so
// the refusals say nothing beyond "some documents matched". The
// documents are byte-for-byte unchanged.
func TestRefusalsAreNoOracle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	direct := goClient(t, directURI)
	holderClient, err := mongo.Connect(ctx, options.Client().ApplyURI(proxyURI).SetAppName("oracle-holder"))
	if err != nil {
		t.Fatal(err)
	}
	defer holderClient.Disconnect(context.Background())
	attacker := goClient(t, proxyURI)

	const locked, unlocked = "oracle-secret-7f3a", "oracle-plain-91c2"
	seeded := direct.Database("shop").Collection("protected")
	for _, d := range []bson.D{{{Key: "_id", Value: locked}, {Key: "secret", Value: "hunter2"}}, {{Key: "_id", Value: unlocked}, {Key: "secret", Value: "xyzzy"}}} {
		if _, err := seeded.InsertOne(ctx, d); err != nil && !mongo.IsDuplicateKeyError(err) {
			t.Fatal(err)
		}
	}
	snap := func() string {
		t.Helper()
		cur, err := seeded.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{locked, unlocked}}}}}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for cur.Next(ctx) {
			b.WriteString(cur.Current.String() + "\n")
		}
		cur.Close(ctx)
		return b.String()
	}
	sess, err := holderClient.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(ctx)
	if err := holderClient.Database("shop").RunCommand(mongo.NewSessionContext(ctx, sess), bson.D{{Key: "acquireLock", Value: "protected"}, {Key: "ids", Value: bson.A{locked}}, {Key: "leaseMS", Value: 60000}}).Err(); err != nil {
		t.Fatal(err)
	}
	before := snap()

	coll := attacker.Database("shop").Collection("protected")
	set := bson.D{{Key: "$set", Value: bson.D{{Key: "probe", Value: 1}}}}
	probes := []struct {
		name string
		run  func() error
	}{
		{"updateMany on a prefix of the locked document's secret", func() error {
			_, err := coll.UpdateMany(ctx, bson.D{{Key: "secret", Value: bson.D{{Key: "$regex", Value: "^hun"}}}}, set)
			return err
		}},
		{"deleteOne on the locked document's secret", func() error {
			_, err := coll.DeleteOne(ctx, bson.D{{Key: "secret", Value: "hunter2"}})
			return err
		}},
		{"findOneAndUpdate on the unlocked document's secret", func() error {
			return coll.FindOneAndUpdate(ctx, bson.D{{Key: "secret", Value: bson.D{{Key: "$gt", Value: "x"}}}}, set).Err()
		}},
	}
	for _, p := range probes {
		err := p.run()
		var se mongo.ServerError
		if !errors.As(err, &se) || !se.HasErrorCode(46) {
			t.Errorf("%s: got %v, want a LockBusy (46) refusal", p.name, err)
			continue
		}
		full := err.Error()
		var ce mongo.CommandError
		if errors.As(err, &ce) {
			full += ce.Raw.String()
		}
		var we mongo.WriteException
		if errors.As(err, &we) {
			full += we.Raw.String()
		}
		for _, leak := range []string{locked, unlocked, "oracle-holder"} {
			if strings.Contains(full, leak) {
				t.Errorf("%s: the refusal reveals %q, which the request did not name: %s", p.name, leak, full)
			}
		}
	}
	if after := snap(); after != before {
		t.Errorf("the documents changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
