package guard

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"

	"github.com/lockgate/lockgate/config"
)

// TestAcquireOverAnotherStoresStamp: a fenced document stamped with a
// token this lockgate's lock store never handed out, a little above what
// its clock gives a first lock: what another lock store (a lockgate with
// a lock store of its own, its estimate of the server clock a few
// milliseconds ahead) wrote for an earlier holder. The later acquireLock
// here must get a token above that stamp, stamp it and keep the lock.
// Before, its token came from its own clock estimate alone, below the
// stamp, its stamp was refused ("another holder's stamp") and the lock
// released; each retry moved the token up by one
// (tests/reliability TestFenceOnAPoisonedField retried for it).
func TestAcquireOverAnotherStoresStamp(t *testing.T) {
	coll := "fencefloor_" + time.Now().Format("150405.000000")[7:]
	pol := config.Policy{Default: config.ModeOff, MaxCandidates: 50,
		Namespaces: []config.NamespaceRule{{Match: "shop." + coll, Mode: config.ModeEnforce, Fence: config.FenceDocument}}}
	st := startStackWith(t, stackOptions{policy: pol})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	direct := connect(t, upstreamURI(t), "direct").Database("shop").Collection(coll)
	field := config.DefaultFenceField
	ahead := time.Now().Add(2 * time.Second).UnixNano()
	if _, err := direct.InsertOne(ctx, bson.D{{"_id", 1}, {field, ahead}}); err != nil {
		t.Fatal(err)
	}
	c := connect(t, st.uri, "later-holder")
	s := session(t, c)
	out, err := run(t, c, s, bson.D{{"acquireLock", coll}, {"ids", bson.A{1}}, {"leaseMS", 20000}})
	if err != nil {
		t.Fatalf("acquireLock over another store's stamp %d: %v", ahead, err)
	}
	locks, _ := out["locks"].(bson.A)
	if len(locks) != 1 {
		t.Fatalf("acquireLock: %v", out)
	}
	tok, _ := locks[0].(bson.M)["token"].(int64)
	if tok <= ahead {
		t.Errorf("token %d, not above the stamp %d", tok, ahead)
	}
	var doc bson.M
	if err := direct.FindOne(ctx, bson.D{{"_id", 1}}).Decode(&doc); err != nil || doc[field] != tok {
		t.Errorf("the document's stamp: %v (%v), want %d", doc[field], err, tok)
	}
	// The holder writes under it.
	if _, err := c.Database("shop").Collection(coll).UpdateOne(inSession(s), bson.D{{"_id", 1}}, bson.D{{"$set", bson.D{{"by", "later"}}}}); err != nil {
		t.Errorf("the holder's write: %v", err)
	}
}
