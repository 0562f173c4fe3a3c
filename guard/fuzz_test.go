package guard

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// unavailableStore answers every call as an unreachable lock store would:
// the fuzz target exercises parsing and decisions, not storage.
type unavailableStore struct{}

func (unavailableStore) Acquire(context.Context, lockstore.Owner, namespace.Namespace, []docid.ID, time.Duration, time.Duration) ([]lockstore.Lock, error) {
	return nil, lockstore.ErrUnavailable
}
func (unavailableStore) Renew(context.Context, lockstore.Owner, namespace.Namespace, []docid.ID, time.Duration) ([]lockstore.Lock, error) {
	return nil, lockstore.ErrUnavailable
}
func (unavailableStore) Release(context.Context, lockstore.Owner, namespace.Namespace, []docid.ID, string) (int, error) {
	return 0, lockstore.ErrUnavailable
}
func (unavailableStore) ReleaseAll(context.Context, lockstore.Owner, namespace.Namespace, string) (int, error) {
	return 0, lockstore.ErrUnavailable
}
func (unavailableStore) ReleaseSession(context.Context, []byte) (int, error) {
	return 0, lockstore.ErrUnavailable
}
func (unavailableStore) Status(context.Context, lockstore.Owner, namespace.Namespace, []docid.ID) ([]lockstore.Status, error) {
	return nil, lockstore.ErrUnavailable
}
func (unavailableStore) Holds(context.Context, lockstore.Owner, namespace.Namespace, []docid.ID, time.Duration) (bool, []docid.ID, error) {
	return false, nil, lockstore.ErrUnavailable
}

// FuzzIntercept sends arbitrary command bodies, lock commands and
// endSessions among them, through Guard.Intercept with a policy that
// enforces everything: whatever the shape of a field, the answer is a reply
// or a decision, never a panic (issue 12: {endSessions: 1} panicked).
func FuzzIntercept(f *testing.F) {
	lsid := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, make([]byte, 16)).Build()
	seed := func(b *bsoncore.DocumentBuilder) []byte {
		return b.AppendDocument("lsid", lsid).AppendString("$db", "shop").Build()
	}
	ids := bsoncore.NewArrayBuilder().AppendInt32(1).AppendString("x").Build()
	for _, name := range []string{"acquireLock", "renewLock", "releaseLock", "lockStatus"} {
		f.Add(seed(bsoncore.NewDocumentBuilder().AppendString(name, "orders").AppendArray("ids", ids).AppendInt32("leaseMS", 1000).AppendInt32("waitMS", 0)))
		f.Add(seed(bsoncore.NewDocumentBuilder().AppendString(name, "orders").AppendInt32("ids", 1)))
		f.Add(seed(bsoncore.NewDocumentBuilder().AppendInt32(name, 1)))
		f.Add(seed(bsoncore.NewDocumentBuilder().AppendString(name, "orders").AppendArray("ids", ids).AppendString("leaseMS", "30s").AppendDouble("waitMS", 1.5).AppendInt32("error", 3)))
	}
	f.Add(seed(bsoncore.NewDocumentBuilder().AppendInt32("endSessions", 1)))
	f.Add(seed(bsoncore.NewDocumentBuilder().AppendArray("endSessions", bsoncore.NewArrayBuilder().AppendInt32(5).AppendDocument(lsid).Build())))
	f.Add(seed(bsoncore.NewDocumentBuilder().AppendString("update", "orders").AppendArray("updates", bsoncore.NewArrayBuilder().AppendInt32(1).Build())))
	f.Add(seed(bsoncore.NewDocumentBuilder().AppendString("find", "locks").AppendString("$db", "lockgate")))
	f.Add(seed(bsoncore.NewDocumentBuilder().AppendString("aggregate", "o").AppendArray("pipeline", bsoncore.NewArrayBuilder().AppendInt32(1).Build())))

	pol, err := policy.Compile(config.Policy{Default: config.ModeEnforce, MaxCandidates: 10})
	if err != nil {
		f.Fatal(err)
	}
	g := New(Options{Store: unavailableStore{}, Reserved: ReservedFor("lockgate", "locks"), OrderTimeout: time.Millisecond})
	g.SetPolicy(pol)
	var conns atomic.Uint64
	f.Fuzz(func(t *testing.T, body []byte) {
		// A connection of its own per input: a connection sending
		// malformed lock commands is slowed down (throttle.go).
		client := &proxy.ClientInfo{ID: conns.Add(1), Addr: "fuzz"}
		// wire.Parse judges the body as the proxy does (bsoncore's own
		// Validate panics on some truncated documents).
		msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body), wire.Limits{})
		if err != nil {
			return
		}
		cmd, err := wire.CommandOf(msg)
		if err != nil || cmd == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		d := g.Intercept(ctx, &proxy.Request{Message: msg, Command: cmd, Client: client})
		if d.Action == proxy.Reply && bsoncore.Document(d.Reply).Validate() != nil {
			t.Fatalf("invalid reply document for %v", bsoncore.Document(body))
		}
	})
}
