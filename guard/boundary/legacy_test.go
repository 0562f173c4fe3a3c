package boundary

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/bson"
	"go.uber.org/zap"
)

// TestBoundarySeesLegacyIndexInserts: an OP_INSERT into
// "<lock store db>.system.indexes" creates the index it describes on
// servers before 4.2 (a TTL index on the lock collection would delete
// every record). Its namespace is not the lock collection's, but the
// write reaches the whole database, and the plan says so.
func TestBoundarySeesLegacyIndexInserts(t *testing.T) {
	off, _ := policy.Compile(config.Policy{Default: config.ModeOff})
	stage := New(ReservedFor("lockgate", "locks"), func() *policy.Policy { return off }, zap.NewNop(), prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refusals"}, []string{"what"}))
	index, err := bson.Marshal(bson.D{{Key: "ns", Value: "lockgate.locks"}, {Key: "key", Value: bson.D{{Key: "exp", Value: 1}}},
		{Key: "name", Value: "exp_1"}, {Key: "expireAfterSeconds", Value: 0}})
	if err != nil {
		t.Fatal(err)
	}
	b := wire.Header{RequestID: 1, OpCode: wire.OpCodeInsert}.Append(nil)
	b = binary.LittleEndian.AppendUint32(b, 0) // flags
	b = append(append(b, "lockgate.system.indexes"...), 0)
	b = append(b, index...)
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	msg, err := wire.Parse(b, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	req := &proxy.Request{Message: msg, Client: &proxy.ClientInfo{ID: 1, Addr: "test"}}
	if d, ok := stage.Decide(context.Background(), req); !ok || d.Action == proxy.Forward {
		t.Fatalf("an OP_INSERT into the lock store's system.indexes was forwarded")
	}
}
