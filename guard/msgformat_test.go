package guard

import (
	"context"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/bson"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/namespace"
)

// TestLeaseErrorsSpeakMilliseconds: lock commands take milliseconds, and
// an over-long leaseMS was refused with Go durations ("lease 277h46m40s
// exceeds the maximum 10m0s", issue 26). The refusal repeats the caller's
// own number and the maximum in milliseconds, naming the setting.
func TestLeaseErrorsSpeakMilliseconds(t *testing.T) {
	s := startStack(t, "")
	c := connect(t, s.uri, "ms-app")
	sess := session(t, c)
	_, err := run(t, c, sess, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{1}}, {Key: "leaseMS", Value: int64(1000000000)}})
	if err == nil {
		t.Fatal("a lease over lockstore.maxLeaseMS was granted")
	}
	msg := err.Error()
	if !strings.Contains(msg, "lease 1000000000 ms exceeds the maximum (lockstore.maxLeaseMS) of 60000 ms") || strings.Contains(msg, "277h") || strings.Contains(msg, "1m0s") {
		t.Errorf("refusal %q, want the lease and the maximum in milliseconds", msg)
	}

	// A value is printed as the shell prints it: 1.5, not
	// {"$numberDouble":"1.5"}.
	_, err = run(t, c, sess, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{1}}, {Key: "waitMS", Value: 1.5}})
	if err == nil || !strings.Contains(err.Error(), "waitMS must be a whole number of milliseconds, got 1.5") || strings.Contains(err.Error(), "numberDouble") {
		t.Errorf("waitMS 1.5: %v, want the value as the shell prints it", err)
	}

	// A write under a lease shorter than the policy's margin: the margin
	// in milliseconds, named by its key, not "45.5s". The lease is long
	// enough to be running still at the write however loaded the machine
	// (a 1 s lease ran out first once, and the write was refused for
	// holding no lock).
	e := startStackWith(t, stackOptions{policy: config.Policy{
		LeaseMarginMS: 45500,
		Namespaces:    []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}},
	}})
	ec := connect(t, e.uri, "ms-app")
	es := session(t, ec)
	if _, err := run(t, ec, es, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{3}}, {Key: "leaseMS", Value: 30000}}); err != nil {
		t.Fatal(err)
	}
	_, err = run(t, ec, es, bson.D{{Key: "update", Value: "orders"}, {Key: "updates", Value: bson.A{bson.D{
		{Key: "q", Value: bson.D{{Key: "_id", Value: 3}}}, {Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}}}}}}})
	if err == nil || !strings.Contains(err.Error(), "margin of 45500 ms (policy.leaseMarginMS)") || strings.Contains(err.Error(), "45.5s") {
		t.Errorf("write under a lease shorter than the margin: %v, want the margin in milliseconds", err)
	}
}

// TestOwnApplicationInAnotherSessionIsNamed: the implicit-session trap (a
// lock taken in one pooled session, the write sent in another) was told
// "held by application X ...; wait for the holder to release it", which
// waits for oneself (issue 26). When the holder is the caller's own
// application (same name, host and user), the refusal and a busy acquire
// say so and give the fix; another application still gets "wait".
func TestOwnApplicationInAnotherSessionIsNamed(t *testing.T) {
	s := startStackWith(t, stackOptions{memStore: decisionStore(), policy: config.Policy{
		Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}},
	}})
	app := connect(t, s.uri, "trap-app")
	other := connect(t, s.uri, "other-app")
	locker, writer := session(t, app), session(t, app)
	if _, err := run(t, app, locker, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{7}}}); err != nil {
		t.Fatal(err)
	}
	update := bson.D{{Key: "update", Value: "orders"}, {Key: "updates", Value: bson.A{bson.D{
		{Key: "q", Value: bson.D{{Key: "_id", Value: 7}}}, {Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}}}}}}}
	const own = "your own application holds this lock in another session"
	for _, tt := range []struct {
		name   string
		run    func() error
		ownApp bool
	}{
		{"write, own app", func() error { _, err := run(t, app, writer, update); return err }, true},
		{"acquire, own app", func() error {
			_, err := run(t, app, writer, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{7}}})
			return err
		}, true},
		{"write, other app", func() error { _, err := run(t, other, session(t, other), update); return err }, false},
		{"acquire, other app", func() error {
			_, err := run(t, other, session(t, other), bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{7}}})
			return err
		}, false},
	} {
		err := tt.run()
		if err == nil {
			t.Fatalf("%s: not refused", tt.name)
		}
		msg := err.Error()
		if got := strings.Contains(msg, own); got != tt.ownApp {
			t.Errorf("%s: names the caller's own application: %v, want %v\n%s", tt.name, got, tt.ownApp, msg)
		}
		if tt.ownApp && (strings.Contains(msg, "wait for the holder") || strings.Contains(msg, "waitMS")) {
			t.Errorf("%s: advises waiting for itself:\n%s", tt.name, msg)
		}
		if !strings.Contains(msg, `held by application "trap-app"`) {
			t.Errorf("%s: does not name the holder:\n%s", tt.name, msg)
		}
	}
}

// TestForceReleaseExplainedToTheNextWrite: after an operator
// force-released a lock, only renewLock said so; the former holder's next
// write was told "this session does not hold the lock" and nothing of why
// (issue 26). It now says when, and the reason the operator gave.
func TestForceReleaseExplainedToTheNextWrite(t *testing.T) {
	s := startStackWith(t, stackOptions{policy: config.Policy{
		Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}},
	}})
	c := connect(t, s.uri, "forced-app")
	sess := session(t, c)
	if _, err := run(t, c, sess, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{9}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.store.ForceRelease(context.Background(), namespace.Of("shop.orders"), lockstoretest.ID(int32(9)), "stuck batch job"); err != nil {
		t.Fatal(err)
	}
	_, err := run(t, c, sess, bson.D{{Key: "update", Value: "orders"}, {Key: "updates", Value: bson.A{bson.D{
		{Key: "q", Value: bson.D{{Key: "_id", Value: 9}}}, {Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}}}}}}})
	if err == nil {
		t.Fatal("a write under a force-released lock was not refused")
	}
	if msg := err.Error(); !strings.Contains(msg, "an operator force-released it at ") || !strings.Contains(msg, `(reason: "stuck batch job")`) {
		t.Errorf("refusal %q, want it to say that an operator force-released the lock, when and why", msg)
	}
}
