package boundary

import (
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// TestBoundarySeesDatabaseWideWrites: commands that write where their
// first value does not say (clone copies into every collection of $db and
// names a host; an insert into system.indexes on servers before 4.2 can put
// a TTL index on any collection of the database; internalRename... names
// its source in from) are refused on the lock store's database. The
// classifier already read them so; the boundary's walk did not.
func TestBoundarySeesDatabaseWideWrites(t *testing.T) {
	stage := New(ReservedFor("lockgate", "locks"), func() *policy.Policy { return nil }, zap.NewNop(), nil)
	for _, tc := range []struct {
		name string
		body bson.D
	}{
		{"clone", bson.D{{Key: "clone", Value: "host:27017"}, {Key: "$db", Value: "lockgate"}}},
		{"system.indexes insert", bson.D{{Key: "insert", Value: "system.indexes"}, {Key: "documents", Value: bson.A{
			bson.D{{Key: "ns", Value: "lockgate.locks"}, {Key: "key", Value: bson.D{{Key: "exp", Value: 1}}}, {Key: "name", Value: "exp_1"}, {Key: "expireAfterSeconds", Value: 0}}}},
			{Key: "$db", Value: "lockgate"}}},
		{"internalRename from", bson.D{{Key: "internalRenameIfOptionsAndIndexesMatch", Value: 1}, {Key: "from", Value: "lockgate.locks"},
			{Key: "to", Value: "shop.stolen"}, {Key: "$db", Value: "admin"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := bson.Marshal(tc.body)
			if err != nil {
				t.Fatal(err)
			}
			msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, b), wire.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			cmd, err := wire.CommandOf(msg)
			if err != nil {
				t.Fatal(err)
			}
			if e, what := stage.refusal(&proxy.Request{Message: msg, Command: cmd}, nil); e == nil || what != "lock_store" {
				t.Errorf("not refused at the lock store's boundary (%v, %q)", e, what)
			}
		})
	}
}
