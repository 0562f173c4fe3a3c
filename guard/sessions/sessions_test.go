package sessions

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

type fakeStore struct{ released [][]byte }

func (s *fakeStore) ReleaseSession(_ context.Context, key []byte) (int, error) {
	s.released = append(s.released, key)
	return 1, nil
}

// busyFlights has a write in flight in the sessions whose key is busy.
type busyFlights struct{ busy []byte }

func (f busyFlights) WaitSession(_ context.Context, key []byte) error {
	if bytes.Equal(key, f.busy) {
		return context.DeadlineExceeded
	}
	return nil
}

func lsid(b byte) bsoncore.Document {
	return bsoncore.NewDocumentBuilder().AppendBinary("id", 4, bytes.Repeat([]byte{b}, 16)).Build()
}

func request(t *testing.T, body bsoncore.Document) *proxy.Request {
	t.Helper()
	msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	return &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}}
}

func endSessions(ids ...bsoncore.Document) bsoncore.Document {
	arr := bsoncore.NewArrayBuilder()
	for _, id := range ids {
		arr.AppendDocument(id)
	}
	return bsoncore.NewDocumentBuilder().AppendArray("endSessions", arr.Build()).AppendString("$db", "admin").Build()
}

// TestEndSessionsReleasesEachSessionsLocks: every ended session's locks are
// released under its owner key, except a session with a write still in
// flight (its locks stay until the write is answered); an upstream that
// knows endSessions gets it, one that does not is answered for, and it is
// asked once.
func TestEndSessionsReleasesEachSessionsLocks(t *testing.T) {
	store := &fakeStore{}
	ended := prometheus.NewCounter(prometheus.CounterOpts{Name: "ended"})
	asked, supported := 0, true
	s := New(Config{Store: store, Flights: busyFlights{busy: append([]byte("k"), bytes.Repeat([]byte{3}, 16)...)},
		SessionKey:           func(user string, id []byte) []byte { return append([]byte("k"+user), id...) },
		Admit:                func(context.Context, *proxy.ClientInfo, int) bool { return true },
		EndSessionsSupported: func(context.Context) (bool, error) { asked++; return supported, nil },
		Log:                  zap.NewNop(), Ended: ended})
	ctx := context.Background()

	d, ok := s.Decide(ctx, request(t, endSessions(lsid(1), lsid(2), lsid(3))))
	if !ok || d.Action != proxy.Forward {
		t.Fatalf("endSessions on an upstream that knows it: %v %+v, want Forward", ok, d)
	}
	if len(store.released) != 2 || store.released[0][1] != 1 || store.released[1][1] != 2 {
		t.Errorf("released %q, want sessions 1 and 2 (3 has a write in flight)", store.released)
	}
	if n := testutil.ToFloat64(ended); n != 2 {
		t.Errorf("sessions ended counted %v, want 2", n)
	}

	s = New(Config{Store: store, Flights: busyFlights{}, SessionKey: func(_ string, id []byte) []byte { return id },
		Admit: func(context.Context, *proxy.ClientInfo, int) bool { return true }, Log: zap.NewNop(), Ended: ended,
		EndSessionsSupported: func(context.Context) (bool, error) { asked++; return false, nil }})
	asked = 0
	for range 2 {
		d, ok = s.Decide(ctx, request(t, endSessions(lsid(4))))
		if ok2, _ := d.Reply.Lookup("ok").DoubleOK(); !ok || d.Action != proxy.Reply || ok2 != 1 {
			t.Fatalf("endSessions on an upstream that does not know it: %v %+v, want ok: 1 answered by the proxy", ok, d)
		}
	}
	if asked != 1 {
		t.Errorf("the upstream's support asked %d times, want once", asked)
	}
}

// TestSessionStageSettlesOnlyItsCommands: endSessions of the wrong type is
// the server's TypeMismatch with nothing released; commit and abort go to
// the transaction check; anything else passes.
func TestSessionStageSettlesOnlyItsCommands(t *testing.T) {
	store := &fakeStore{}
	var txns int
	s := New(Config{Store: store, Flights: busyFlights{}, SessionKey: func(_ string, id []byte) []byte { return id },
		Admit: func(context.Context, *proxy.ClientInfo, int) bool { return true }, Log: zap.NewNop(),
		Ended: prometheus.NewCounter(prometheus.CounterOpts{Name: "ended"}),
		EndTransaction: func(context.Context, *proxy.Request) proxy.Decision {
			txns++
			return proxy.Decision{Action: proxy.Forward}
		}})
	ctx := context.Background()
	bad := bsoncore.NewDocumentBuilder().AppendString("endSessions", "x").AppendString("$db", "admin").Build()
	d, ok := s.Decide(ctx, request(t, bad))
	code, _ := d.Reply.Lookup("code").AsInt64OK()
	if !ok || d.Action != proxy.Reply || mongoerr.Code(code) != mongoerr.TypeMismatch || len(store.released) != 0 {
		t.Errorf("endSessions: \"x\": %v %+v, released %d; want TypeMismatch and nothing released", ok, d, len(store.released))
	}
	for _, name := range []string{"commitTransaction", "abortTransaction"} {
		body := bsoncore.NewDocumentBuilder().AppendInt32(name, 1).AppendString("$db", "admin").Build()
		if _, ok := s.Decide(ctx, request(t, body)); !ok {
			t.Errorf("%s passed", name)
		}
	}
	if txns != 2 {
		t.Errorf("the transaction check decided %d commands, want 2", txns)
	}
	find := bsoncore.NewDocumentBuilder().AppendString("find", "orders").AppendString("$db", "shop").Build()
	if _, ok := s.Decide(ctx, request(t, find)); ok {
		t.Error("the session stage settled a find")
	}
}
