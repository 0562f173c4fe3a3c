package lockcmd

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/authority"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

type noFlights struct{}

func (noFlights) WaitSession(context.Context, []byte) error { return nil }

// stage is a lock command stage over an in-memory lock store, with no
// throttle, fence or policy: the lock commands alone.
func stage(t *testing.T, required bool) (*Stage, *[]string) {
	t.Helper()
	var results []string
	return New(Config{
		Store: memstore.New(memstore.Config{}),
		Owner: func(req *proxy.Request, session []byte, bind string) lockstore.Owner {
			return lockstore.Owner{Session: append([]byte("k"), session...), App: req.Client.AppName(), Bind: bind}
		},
		SessionKey: func(_ string, lsid []byte) []byte { return append([]byte("k"), lsid...) },
		Authority:  authority.New(func() bool { return required }),
		Admit:      func(context.Context, *proxy.ClientInfo, int) bool { return true },
		Done:       func(*proxy.ClientInfo, bool) {},
		Flights:    noFlights{},
		Fence: func(context.Context, namespace.Namespace, lockstore.Owner, []lockstore.Lock) *refuse.Error {
			return nil
		},
		Policy:  func() *policy.Policy { return nil },
		Observe: func(command, result string, _ time.Duration) { results = append(results, command+" "+result) },
		MaxWait: time.Second, MaxLockIDs: 10, OrderTimeout: time.Second,
	}), &results
}

func lockRequest(t *testing.T, name string, session byte, extra func(*bsoncore.DocumentBuilder)) *proxy.Request {
	t.Helper()
	b := bsoncore.NewDocumentBuilder().AppendString(name, "orders")
	if extra != nil {
		extra(b)
	}
	if session != 0 {
		b.AppendDocument("lsid", bsoncore.NewDocumentBuilder().AppendBinary("id", 4, bytes.Repeat([]byte{session}, 16)).Build())
	}
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, b.AppendString("$db", "shop").Build()), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	return &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}}
}

func ids(vals ...int32) func(*bsoncore.DocumentBuilder) {
	return func(b *bsoncore.DocumentBuilder) {
		arr := bsoncore.NewArrayBuilder()
		for _, v := range vals {
			arr.AppendInt32(v)
		}
		b.AppendArray("ids", arr.Build())
	}
}

func decide(t *testing.T, s *Stage, req *proxy.Request) bsoncore.Document {
	t.Helper()
	d, ok := s.Decide(context.Background(), req)
	if !ok || d.Action != proxy.Reply {
		t.Fatalf("%s: settled %v, %+v; want the proxy's own reply", req.Command.Name, ok, d)
	}
	return d.Reply
}

func reason(reply bsoncore.Document) string {
	r, _ := reply.Lookup("lockgate", "reason").StringValueOK()
	return r
}

// TestLockCommandsAnsweredFromTheStore: acquire, a second session refused
// (held), status, release; every result counted; nothing else settled.
func TestLockCommandsAnsweredFromTheStore(t *testing.T) {
	s, results := stage(t, false)
	if r := decide(t, s, lockRequest(t, "acquireLock", 1, ids(7))); reason(r) != "" {
		t.Fatalf("acquire: %v", bsoncore.Document(r))
	}
	if r := decide(t, s, lockRequest(t, "acquireLock", 2, ids(7))); reason(r) != refuse.ReasonHeld {
		t.Fatalf("acquire by another session: %v, want %s", bsoncore.Document(r), refuse.ReasonHeld)
	}
	st := decide(t, s, lockRequest(t, "lockStatus", 2, ids(7)))
	if held, _ := st.Lookup("locks", "0", "held").BooleanOK(); !held {
		t.Errorf("lockStatus: %v, want held", st)
	}
	rel := decide(t, s, lockRequest(t, "releaseLock", 1, ids(7)))
	if n, _ := rel.Lookup("released").Int32OK(); n != 1 {
		t.Errorf("release: %v, want released: 1", rel)
	}
	want := []string{"acquireLock ok", "acquireLock held", "lockStatus ok", "releaseLock ok"}
	if len(*results) != len(want) {
		t.Fatalf("counted %q, want %q", *results, want)
	}
	for i := range want {
		if (*results)[i] != want[i] {
			t.Errorf("counted %q, want %q", *results, want)
		}
	}
	find := bsoncore.NewDocumentBuilder().AppendString("find", "orders").AppendString("$db", "shop").Build()
	msg, _ := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, find), wire.Limits{})
	cmd, _ := wire.CommandOf(msg)
	if _, ok := s.Decide(context.Background(), &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: 1}}); ok {
		t.Error("the lock command stage settled a find")
	}
}

// TestLockCommandRefusals: what a lock command needs before it touches
// the lock store, each refused with the server's code and nothing taken.
func TestLockCommandRefusals(t *testing.T) {
	s, _ := stage(t, false)
	for _, tc := range []struct {
		name   string
		req    *proxy.Request
		code   mongoerr.Code
		reason string
	}{
		{"no session", lockRequest(t, "acquireLock", 0, ids(7)), mongoerr.BadValue, refuse.ReasonNoSession},
		{"no ids", lockRequest(t, "acquireLock", 1, nil), mongoerr.BadValue, refuse.ReasonBadArgument},
		{"too many ids", lockRequest(t, "acquireLock", 1, ids(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)), mongoerr.BadValue, refuse.ReasonBadArgument},
		{"unknown field", lockRequest(t, "acquireLock", 1, func(b *bsoncore.DocumentBuilder) { ids(7)(b); b.AppendInt32("x", 1) }), mongoerr.IDLUnknownField, refuse.ReasonBadArgument},
		{"wait over the limit", lockRequest(t, "acquireLock", 1, func(b *bsoncore.DocumentBuilder) { ids(7)(b); b.AppendInt32("waitMS", 5000) }), mongoerr.BadValue, refuse.ReasonBadArgument},
	} {
		r := decide(t, s, tc.req)
		code, _ := r.Lookup("code").AsInt64OK()
		if mongoerr.Code(code) != tc.code || reason(r) != tc.reason {
			t.Errorf("%s: %v, want code %v reason %s", tc.name, r, tc.code, tc.reason)
		}
	}
	st := decide(t, s, lockRequest(t, "lockStatus", 2, ids(7)))
	if held, _ := st.Lookup("locks", "0", "held").BooleanOK(); held {
		t.Errorf("a refused acquire took the lock: %v", st)
	}
	// Where the upstream requires authentication, an unauthenticated
	// connection's lock command carries no authority.
	s, _ = stage(t, true)
	if r := decide(t, s, lockRequest(t, "acquireLock", 1, ids(7))); reason(r) != refuse.ReasonUnauthenticated {
		t.Errorf("acquire before authentication: %v, want %s", r, refuse.ReasonUnauthenticated)
	}
}

// TestLockCommandOnAnInvalidDatabase: a lock command whose $db no
// database can be named (MongoDB refuses such names) is refused with
// InvalidNamespace, and takes no lock on the namespace it would spell.
func TestLockCommandOnAnInvalidDatabase(t *testing.T) {
	s, _ := stage(t, false)
	for _, db := range []string{"sh.op", "sh$op", "sh op", `sh\op`, "sh/op", `sh"op`, strings.Repeat("d", 64)} {
		req := lockRequest(t, "acquireLock", 1, ids(7))
		b := bsoncore.NewDocumentBuilder().AppendString("acquireLock", "orders")
		ids(7)(b)
		b.AppendDocument("lsid", bsoncore.NewDocumentBuilder().AppendBinary("id", 4, bytes.Repeat([]byte{1}, 16)).Build())
		msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, b.AppendString("$db", db).Build()), wire.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if req.Command, err = wire.CommandOf(msg); err != nil {
			t.Fatal(err)
		}
		req.Message = msg
		r := decide(t, s, req)
		if code, _ := r.Lookup("code").AsInt64OK(); mongoerr.Code(code) != mongoerr.InvalidNamespace || reason(r) != refuse.ReasonBadArgument {
			t.Errorf("acquireLock on database %q: %v, want InvalidNamespace", db, r)
		}
		o := lockstore.Owner{Session: append([]byte("k"), bytes.Repeat([]byte{1}, 16)...)}
		sts, err := s.cfg.Store.Status(context.Background(), o, namespace.New(db, "orders"), []docid.ID{lockstoretest.ID(7)})
		if err != nil || len(sts) != 1 || sts[0].Held {
			t.Errorf("acquireLock on database %q took the lock: %v %v", db, sts, err)
		}
	}
}
