package enforce

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/authority"
	"github.com/lockgate/lockgate/guard/guardtest"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// The tests of this file close the gaps the fourteenth box's mutation
// campaign over the enforcement core found (docs/TESTING.md, "Issue 25:
// the fourteenth box's mutation campaign (h23-mut)"): each names the
// mutant it fails under.

// TestPinMemoKeepsOnlySingleIDFilters: the connection's memo of pinned
// filters keeps a filter only when it pins one _id (it keeps that one
// id): a filter pinning two, written again, still needs both locks.
// Mutant: PinMemos.put keeping any filter (len(ids) < 1), which kept
// {_id: {$in: [7, 8]}} as pinning 7 alone, so its second write went
// through with only 7 locked.
func TestPinMemoKeepsOnlySingleIDFilters(t *testing.T) {
	var memo PinMemos
	targets := NewTargets(TargetsConfig{Resolver: guardtest.NewResolver(), ResolveTimeout: time.Second, Authority: authority.New(nil),
		Throttle: &fakeThrottle{slots: make(chan struct{}, 1)}, PinMemos: func(*proxy.Request) *PinMemos { return &memo },
		Resolves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "resolves"}, []string{"outcome"}),
		Seconds:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seconds"})})
	req := &proxy.Request{Client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}}
	w := update(t, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{7, 8}}}}})
	for round := range 3 {
		var buf [1]bsoncore.Value
		var x Target
		targets.Of(context.Background(), req, &enforced, &w, false, false, buf[:0], &x)
		if !x.OK {
			t.Fatalf("round %d: %+v", round, x)
		}
		sameIDs(t, "two pinned ids, written again", x.IDs, 7, 8)
	}
	// The memo is in use: a single-id filter is kept.
	one := update7(t)
	var buf [1]bsoncore.Value
	var x Target
	targets.Of(context.Background(), req, &enforced, &one, false, false, buf[:0], &x)
	if memo.m[0].ids == nil {
		t.Fatal("a single-id filter was not memoized: the test proves nothing about the memo")
	}
}

// tokensOnly is a lock store that reports tokens (HeldTokens) but not
// into the caller's slice (no HeldTokensInto), nor a memo: a store
// written to the interface's required part and TokenStore alone.
type tokensOnly struct{ s *memstore.Store }

func (p tokensOnly) Status(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error) {
	return p.s.Status(ctx, o, ns, ids)
}

func (p tokensOnly) Holds(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) (bool, []docid.ID, error) {
	return p.s.Holds(ctx, o, ns, ids, margin)
}

func (p tokensOnly) HeldTokens(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) ([]int64, time.Duration, []docid.ID, error) {
	return p.s.HeldTokens(ctx, o, ns, ids, margin)
}

// TestLockCheckThroughHeldTokens: on a store that reports tokens only by
// HeldTokens, a lock not held is missing, and a write of it refused.
// Mutant: Locks.Check dropping HeldTokens' missing ids (Missing: nil on
// that path): every write on such a store was allowed.
func TestLockCheckThroughHeldTokens(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(memstore.Config{})
	a, b := ownerOf(1), ownerOf(2)
	const ns = "shop.orders"
	locks := acquire(t, s, a, ns, id(t, 7))
	acquire(t, s, b, ns, id(t, 8))
	l := NewLocks(tokensOnly{s})
	if !l.Measures() || l.into != nil {
		t.Fatal("the store is not one of tokens without HeldTokensInto: the test proves nothing")
	}
	var buf [1]int64
	h, err := l.Check(ctx, &a, namespace.Of(ns), []docid.ID{id(t, 7)}, time.Second, true, buf[:0])
	if err != nil || len(h.Missing) != 0 || !h.Measured || len(h.Tokens) != 1 || h.Tokens[0] != locks[0].Token {
		t.Fatalf("held: %+v, %v", h, err)
	}
	for _, ids := range [][]docid.ID{{id(t, 8)}, {id(t, 9)}, {id(t, 7), id(t, 8)}} {
		h, err := l.Check(ctx, &a, namespace.Of(ns), ids, time.Second, false, buf[:0])
		if err != nil || len(h.Missing) == 0 || h.Measured {
			t.Errorf("%v: %+v, %v; want missing", ids, h, err)
		}
	}
	d, seen := decideWrites(t, tokensOnly{s}, a, []stmt{{ns, policy.Enforce, bson.A{8}}})
	if d.Action != proxy.Reply || seen.launched {
		t.Fatalf("a write of a document another session locked, on a HeldTokens store: action %v, launched %v", d.Action, seen.launched)
	}
}

// laggingStore is a lock store whose Status trusts a head record that
// lags behind its claims (it sees no lock), while ConfirmedStatus sees
// the lock another session holds.
type laggingStore struct{ *memstore.Store }

func (l laggingStore) Status(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error) {
	sts, err := l.Store.Status(ctx, o, ns, ids)
	for i := range sts {
		sts[i].Held, sts[i].HeldByYou = false, false
	}
	return sts, err
}

func (l laggingStore) ConfirmedStatus(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error) {
	return l.Store.Status(ctx, o, ns, ids)
}

// TestInsertableAsksTheConfirmedStatus: whether an inserted _id is locked
// is asked of the store's ConfirmedStatus, where "not held" lets the
// insert through. Mutant: Locks.ConfirmedStatus answering Status on a
// Confirmer (l.confirm ignored): the insert of a locked _id went through
// while the head record lagged.
func TestInsertableAsksTheConfirmedStatus(t *testing.T) {
	s := memstore.New(memstore.Config{})
	a, b := ownerOf(1), ownerOf(2)
	acquire(t, s, b, "shop.orders", id(t, 7))
	l := NewLocks(laggingStore{s})
	r := policy.Rule{Mode: policy.Enforce, Inserts: policy.InsertsRequireUnlocked}
	w := policy.Write{NS: namespace.Of("shop.orders"), Kind: policy.KindInsert}
	x, checked := l.Insertable(context.Background(), &a, &r, w, []docid.ID{id(t, 7)})
	if !checked || x == nil || x.Reason != ReasonInsertLocked {
		t.Fatalf("insert of an _id another session locked, the head record lagging: %+v, checked %v", x, checked)
	}
	if x, _ := l.Insertable(context.Background(), &a, &r, w, []docid.ID{id(t, 9)}); x != nil {
		t.Fatalf("insert of a free _id: %+v", x)
	}
}

// TestLocksUnreadableFailClosed: when the lock store cannot answer, an
// insert that needs its _id unlocked is refused as unavailable, and so
// is a write whose locks cannot be checked (not as "not locked", whose
// advice is to take a lock the store cannot give). Mutants:
// Locks.Insertable ignoring the store's error (the insert went
// through); Checker.Check ignoring it (refused as not_locked).
func TestLocksUnreadableFailClosed(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(memstore.Config{})
	a := ownerOf(1)
	acquire(t, s, a, "shop.orders", id(t, 7))
	s.SetUnavailable(errors.New("lock store down"))
	l := NewLocks(s)
	r := policy.Rule{Mode: policy.Enforce, MaxCandidates: 3, Inserts: policy.InsertsRequireUnlocked}
	ins := policy.Write{NS: namespace.Of("shop.orders"), Kind: policy.KindInsert}
	x, checked := l.Insertable(ctx, &a, &r, ins, []docid.ID{id(t, 9)})
	if !checked || x == nil || x.Reason != refuse.ReasonUnavailable {
		t.Fatalf("insert with the lock store down: %+v, checked %v; want refused as %s", x, checked, refuse.ReasonUnavailable)
	}

	c := &Checker[*Verdict]{Locks: l}
	w := update7(t)
	base := &Verdict{Writes: []policy.Write{w}, Req: request(t, bson.D{{Key: "update", Value: "orders"}, {Key: "$db", Value: "shop"}})}
	c.Check(ctx, base, base, &r, &a, w.NS, []docid.ID{id(t, 7)})
	if len(base.Violations) != 1 || base.Violations[0].Reason != refuse.ReasonUnavailable {
		t.Fatalf("lock check with the lock store down: %+v; want one violation, %s", base.Violations, refuse.ReasonUnavailable)
	}
}

// TestCappedUnreadableFailsClosed: an insert into a collection whose
// options cannot be read is refused, as it might be capped and evict
// locked documents. Mutant: Targets.Capped ignoring the resolver's error
// (case err != nil never taken): the insert went through.
func TestCappedUnreadableFailsClosed(t *testing.T) {
	f := newTargets(t, true)
	f.res.SetUnavailable(errors.New("listCollections: connection reset"))
	w := policy.Write{NS: namespace.Of("shop.log"), Kind: policy.KindInsert}
	if reason, detail := f.targets.Capped(context.Background(), &enforced, w); reason != ReasonResolveFailed {
		t.Fatalf("capped unreadable: %q %q; want %s", reason, detail, ReasonResolveFailed)
	}
}

// TestStringPinWithoutResolver: without a resolver the collection's
// collation cannot be read, so a pinned string _id ("a" may match "A")
// is not taken as exact: the write is refused, not checked against the
// lock of "a" alone. Mutant: ExactStrings answering true without a
// resolver.
func TestStringPinWithoutResolver(t *testing.T) {
	g := newTargets(t, false)
	x := g.of(enforced, update(t, bson.D{{Key: "_id", Value: "a"}}), true, false)
	if x.OK || x.Reason != ReasonResolveFailed {
		t.Fatalf("a string _id with no resolver to read the collation: %+v; want %s", x, ReasonResolveFailed)
	}
	w := update(t, bson.D{{Key: "_id", Value: "a"}})
	w.Collation = raw(t, bson.D{{Key: "locale", Value: "simple"}})
	if x := g.of(enforced, w, true, false); !x.OK {
		t.Fatalf("a string _id under the statement's own simple collation: %+v", x)
	}
}

// TestOwnerKeyBindsTheUser: two users of the same length, in one lsid,
// are two owners, and so are a user and a longer lsid that together
// spell the same bytes. Mutants: the user left out of the keyed hash
// (TestOwnerKeyCache's users differ in length, which the length prefix
// alone told apart); the length prefix left out.
func TestOwnerKeyBindsTheUser(t *testing.T) {
	k := NewOwnerKeys(bytes.Repeat([]byte("k"), MinOwnerSecret))
	lsid := bytes.Repeat([]byte{5}, 16)
	if bytes.Equal(k.Session("alice@admin", lsid), k.Session("carol@admin", lsid)) {
		t.Fatal("two users of the same length share an owner key for one lsid")
	}
	moved := append([]byte("n"), lsid...) // "admin" + lsid as "admi" + ("n" + lsid)
	if bytes.Equal(k.Session("admin", lsid), k.Session("admi", moved)) {
		t.Fatal("moving a byte from the user to the lsid gives the same owner key")
	}
}

// TestRulesMemoSeesTheIdentity: a connection's rule memo gives a rule
// narrowed to some users or applications back only to the same user and
// application: a connection that authenticates as another user (or
// logs out), or names its application only after writing, gets its own
// rule. Mutants: Rules.Ref ignoring the user, or the application (the
// memo kept the rule of the identity the connection had before).
func TestRulesMemoSeesTheIdentity(t *testing.T) {
	byUser := compile(t, config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "db.locked", Mode: config.ModeEnforce,
		Clients: &config.Clients{Users: []string{"batch@admin"}}, OtherClients: config.ModeOff}}})
	byApp := compile(t, config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "db.locked", Mode: config.ModeEnforce,
		Clients: &config.Clients{AppNames: []string{"billing"}}, OtherClients: config.ModeOff}}})
	ns := namespace.Of("db.locked")
	for _, s := range []struct {
		what          string
		pol           *policy.Policy
		app, user     string
		app2, user2   string
		before, after policy.Mode
	}{
		{"authenticates as the narrowed user", byUser, "", "web@admin", "", "batch@admin", policy.Off, policy.Enforce},
		{"logs out", byUser, "", "batch@admin", "", "", policy.Enforce, policy.Off},
		{"names its application late", byApp, "", "", "billing", "", policy.Off, policy.Enforce},
	} {
		c := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}
		var m Rules
		setClientIdentity(t, c, s.app, s.user)
		if got := m.Ref(s.pol, c, ns)[0].Mode; got != s.before {
			t.Fatalf("%s: before, mode %s, want %s", s.what, got, s.before)
		}
		setClientIdentity(t, c, s.app2, s.user2)
		if got := m.Ref(s.pol, c, ns)[0].Mode; got != s.after {
			t.Errorf("%s: the memo gave mode %s, want %s", s.what, got, s.after)
		}
	}
}

// setClientIdentity sets a client's application name and user, which only
// the proxy sets (its handshake and authentication), in place, as the
// guard's tests do (guard's setIdentity): the test fails if their layout
// is no longer the one written to.
func setClientIdentity(t *testing.T, c *proxy.ClientInfo, app, user string) {
	t.Helper()
	type identity struct{ appName, driver, user string }
	f := reflect.ValueOf(c).Elem().FieldByName("id")
	if !f.IsValid() || f.Type().Size() != unsafe.Sizeof(atomic.Pointer[identity]{}) || f.Type().Name() != "Pointer[github.com/lockgate/lockgate/proxy.clientID]" {
		t.Fatalf("proxy.ClientInfo's identity is not an atomic pointer to clientID: %v", f)
	}
	id := f.Type().Field(0).Type.Elem().Elem()
	want := []string{"appName", "driver", "user"}
	if id.Size() != unsafe.Sizeof(identity{}) || id.NumField() != len(want) {
		t.Fatalf("proxy.clientID is not %v: %v", want, id)
	}
	for i, name := range want {
		if id.Field(i).Name != name || id.Field(i).Type.Kind() != reflect.String {
			t.Fatalf("proxy.clientID is not %v: %v", want, id)
		}
	}
	(*atomic.Pointer[identity])(unsafe.Pointer(f.UnsafeAddr())).Store(&identity{appName: app, user: user})
	if c.AppName() != app || c.User() != user {
		t.Fatalf("set %q %q, the client says %q %q", app, user, c.AppName(), c.User())
	}
}

// TestInsertOfADocumentWithTwoIDs: an inserted document whose _id appears
// twice is refused where inserted _ids must be unlocked: which of its
// values the server would keep cannot be told, and one of them is locked
// by another session. Mutant: Walk.insert's case !certain never taken
// (the insert went through unchecked).
func TestInsertOfADocumentWithTwoIDs(t *testing.T) {
	s := memstore.New(memstore.Config{})
	acquire(t, s, ownerOf(2), "shop.orders", id(t, 8))
	walk := collatedWalk(s, newCollatingResolver(), ownerOf(1))
	twice := bson.D{{Key: "insert", Value: "orders"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: 7}, {Key: "_id", Value: 8}, {Key: "n", Value: 1}}}}}
	if d, x := walk(t, twice); d.Action != proxy.Reply || x == nil || x.Reason != ReasonUnclassifiable {
		t.Fatalf("insert of {_id: 7, _id: 8}, 8 locked by another session: action %v, violation %+v; want refused as %s", d.Action, x, ReasonUnclassifiable)
	}
	if d, _ := walk(t, insertOf(7)); d.Action != proxy.Forward {
		t.Fatalf("insert of {_id: 7}, free: action %v", d.Action)
	}
}
