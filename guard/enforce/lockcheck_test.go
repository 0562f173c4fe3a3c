package enforce

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
)

func id(t *testing.T, v any) docid.ID {
	t.Helper()
	d, err := docid.Of(v)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func ownerOf(b byte) lockstore.Owner {
	return lockstore.Owner{Session: bytes.Repeat([]byte{b}, 16)}
}

func acquire(t *testing.T, s *memstore.Store, o lockstore.Owner, ns string, ids ...docid.ID) []lockstore.Lock {
	t.Helper()
	locks, err := s.Acquire(context.Background(), o, namespace.Of(ns), ids, 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	return locks
}

// plainStore is a lock store with no optional capability: no tokens, no
// memo, no confirmed status.
type plainStore struct{ s *memstore.Store }

func (p plainStore) Status(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error) {
	return p.s.Status(ctx, o, ns, ids)
}

func (p plainStore) Holds(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID, margin time.Duration) (bool, []docid.ID, error) {
	return p.s.Holds(ctx, o, ns, ids, margin)
}

// TestLockCheck: held locks are reported with their lease and tokens;
// a lock held by another session, none at all, or one with less than
// the margin left is missing; a fenced write on a store that reports no
// tokens fails closed.
func TestLockCheck(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(memstore.Config{})
	l := NewLocks(s)
	a, b := ownerOf(1), ownerOf(2)
	const ns = "shop.orders"
	locks := acquire(t, s, a, ns, id(t, 7), id(t, 9))
	acquire(t, s, b, ns, id(t, 8))

	var buf [1]int64
	h, err := l.Check(ctx, &a, namespace.Of(ns), []docid.ID{id(t, 7)}, time.Second, false, buf[:0])
	if err != nil || len(h.Missing) > 0 || !h.Measured {
		t.Fatalf("held: %+v, %v", h, err)
	}
	if h.Left <= 0 || h.Left > 30*time.Second || h.Tokens[0] != locks[0].Token {
		t.Fatalf("held: lease left %s, token %d (lock's %d)", h.Left, h.Tokens[0], locks[0].Token)
	}
	if &h.Tokens[0] != &buf[0] {
		t.Error("the token of the one id was not written into the buffer given")
	}
	h, err = l.Check(ctx, &a, namespace.Of(ns), []docid.ID{id(t, 7), id(t, 9)}, time.Second, true, buf[:0])
	if err != nil || len(h.Missing) > 0 || len(h.Tokens) != 2 || h.Tokens[1] != locks[1].Token {
		t.Fatalf("two held: %+v, %v", h, err)
	}

	for name, c := range map[string]struct {
		ids    []docid.ID
		margin time.Duration
	}{
		"held by another": {[]docid.ID{id(t, 8)}, time.Second},
		"not locked":      {[]docid.ID{id(t, 10)}, time.Second},
		"one of two":      {[]docid.ID{id(t, 7), id(t, 10)}, time.Second},
		"within margin":   {[]docid.ID{id(t, 7)}, time.Minute},
	} {
		h, err := l.Check(ctx, &a, namespace.Of(ns), c.ids, c.margin, false, buf[:0])
		if err != nil || len(h.Missing) == 0 || h.Measured {
			t.Errorf("%s: %+v, %v: want missing", name, h, err)
		}
	}

	p := NewLocks(plainStore{s})
	if p.Measures() {
		t.Fatal("a store without tokens measures")
	}
	if _, err := p.Check(ctx, &a, namespace.Of(ns), []docid.ID{id(t, 7)}, time.Second, true, buf[:0]); !errors.Is(err, ErrNoTokens) || !errors.Is(err, lockstore.ErrUnavailable) {
		t.Fatalf("fenced, no tokens: %v", err)
	}
	if h, err := p.Check(ctx, &a, namespace.Of(ns), []docid.ID{id(t, 7)}, time.Second, false, buf[:0]); err != nil || len(h.Missing) > 0 || h.Measured {
		t.Fatalf("unfenced on a plain store: %+v, %v", h, err)
	}
	if h, _ := p.Check(ctx, &a, namespace.Of(ns), []docid.ID{id(t, 8)}, time.Second, false, buf[:0]); len(h.Missing) != 1 {
		t.Fatalf("held by another on a plain store: %+v", h)
	}
}

// TestLockCheckMemo: a connection's memo answers its repeated check of a
// held lock, and never for a lock released since, nor for another
// owner, document or a margin the lease no longer covers.
func TestLockCheckMemo(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(memstore.Config{})
	l := NewLocks(s)
	a, b := ownerOf(1), ownerOf(2)
	const ns = "shop.orders"
	seven, eight := id(t, 7), id(t, 8)
	acquire(t, s, a, ns, seven)
	var m HeldMemos
	var buf [1]int64
	for i := range 3 {
		if h, ok := m.Check(l, &a, namespace.Of(ns), &seven, time.Second, time.Now(), buf[:]); !ok || !h.Measured || h.Left <= 0 {
			t.Fatalf("check %d of a held lock: %+v, %v", i, h, ok)
		}
	}
	if _, ok := m.Check(l, &b, namespace.Of(ns), &seven, time.Second, time.Now(), buf[:]); ok {
		t.Fatal("the memo answered for another owner")
	}
	if _, ok := m.Check(l, &a, namespace.Of(ns), &eight, time.Second, time.Now(), buf[:]); ok {
		t.Fatal("the memo answered for another document")
	}
	if _, ok := m.Check(l, &a, namespace.Of(ns), &seven, time.Minute, time.Now(), buf[:]); ok {
		t.Fatal("the memo answered for a margin the lease does not cover")
	}
	if _, err := s.Release(ctx, a, namespace.Of(ns), []docid.ID{seven}, ""); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Check(l, &a, namespace.Of(ns), &seven, time.Second, time.Now(), buf[:]); ok {
		t.Fatal("the memo answered for a released lock")
	}
	if h, err := l.Check(ctx, &a, namespace.Of(ns), []docid.ID{seven}, time.Second, false, buf[:0]); err != nil || len(h.Missing) != 1 {
		t.Fatalf("after the release: %+v, %v", h, err)
	}
	if _, ok := new(HeldMemos).Check(NewLocks(plainStore{s}), &a, namespace.Of(ns), &seven, time.Second, time.Now(), buf[:]); ok {
		t.Fatal("a store without memos answered from one")
	}
}

// TestLockHeldElsewhere: on the refusal path, a lock the session holds on
// the same value as another type, or in the doubled namespace, is found.
func TestLockHeldElsewhere(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(memstore.Config{})
	l := NewLocks(s)
	a := ownerOf(1)
	const ns = "shop.orders"
	acquire(t, s, a, ns, id(t, "7"), id(t, int64(12)))
	acquire(t, s, a, "shop.shop.orders", id(t, 9))

	for _, c := range []struct {
		asked any
		want  docid.ID
		found bool
	}{
		{int32(7), id(t, "7"), true},
		{"12", id(t, int64(12)), true},
		{7.5, docid.ID{}, false},
		{int32(8), docid.ID{}, false},
	} {
		got, ok := l.HeldAsOtherType(ctx, &a, namespace.Of(ns), []docid.ID{id(t, c.asked)})
		if ok != c.found || (ok && !got.Equal(c.want)) {
			t.Errorf("asked %v: %v %v, want %v %v", c.asked, got, ok, c.want, c.found)
		}
	}
	if got, ok := l.HeldInDoubledNamespace(ctx, &a, namespace.Of(ns), []docid.ID{id(t, 9)}); !ok || got != "shop.shop.orders" {
		t.Errorf("doubled namespace: %q %v", got, ok)
	}
	if _, ok := l.HeldInDoubledNamespace(ctx, &a, namespace.Of(ns), []docid.ID{id(t, 10)}); ok {
		t.Error("doubled namespace found for an id not locked there")
	}
	if got := TypeName(id(t, "x")) + "/" + TypeName(id(t, int32(1))) + "/" + TypeName(id(t, true)); got != "a string/a number/a boolean" {
		t.Errorf("type names %q", got)
	}
}

// TestMissingRefusal: a write whose session lacks a lock is refused as
// not locked, naming only the ids the request named; the holder is named
// only to a caller who may see it; a lock held with too little lease
// left, and one held as another type, are said so.
func TestMissingRefusal(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(memstore.Config{})
	l := NewLocks(s)
	a, b := ownerOf(1), ownerOf(2)
	const ns = "shop.orders"
	w := policy.Write{NS: namespace.Of(ns)}
	r := &policy.Rule{Mode: policy.Enforce, LeaseMargin: time.Minute}
	acquire(t, s, b, ns, id(t, 8))
	acquire(t, s, a, ns, id(t, 9), id(t, "12"))

	x := l.Missing(ctx, &a, r, w, []docid.ID{id(t, 8)}, 0, true)
	if x.Reason != ReasonHeldByOther || x.Holder == nil || !strings.Contains(x.Detail, "held by") {
		t.Errorf("held by another, disclosed: %+v", x)
	}
	x = l.Missing(ctx, &a, r, w, []docid.ID{id(t, 8)}, 0, false)
	if x.Reason != ReasonNotLocked || x.Holder != nil || x.Detail != "this session does not hold the lock on _id 8" {
		t.Errorf("held by another, not disclosed: %+v", x)
	}
	if x := l.Missing(ctx, &a, r, w, []docid.ID{id(t, 10)}, 0, true); x.Reason != ReasonNotLocked || x.Detail != "this session does not hold the lock on _id 10" {
		t.Errorf("not locked: %+v", x)
	}
	if x := l.Missing(ctx, &a, r, w, []docid.ID{id(t, 9)}, 0, true); !strings.Contains(x.Detail, "less than the policy's margin of 60000 ms") {
		t.Errorf("within margin: %+v", x)
	}
	if x := l.Missing(ctx, &a, r, w, []docid.ID{id(t, int32(12))}, 0, true); !strings.Contains(x.Detail, `it holds the lock on _id "12", a string`) {
		t.Errorf("another type: %+v", x)
	}
	// The usual mix-ups, named (moved here from guard's
	// TestRefusalNamesTheOtherTypeLock and
	// TestRefusalNamesTheDoubledNamespace, which ran them through
	// FerretDB): an ObjectId locked as its hex text and the reverse, and
	// acquireLock: "shop.orders" run on database shop.
	oid, hex := primitive.NewObjectID(), primitive.NewObjectID()
	acquire(t, s, a, ns, id(t, oid.Hex()), id(t, hex))
	acquire(t, s, a, "shop.shop.orders", id(t, 30))
	if x := l.Missing(ctx, &a, r, w, []docid.ID{id(t, oid)}, 0, true); !strings.Contains(x.Detail, `it holds the lock on _id "`+oid.Hex()+`", a string`) {
		t.Errorf("ObjectId locked as its text: %+v", x.Detail)
	}
	if x := l.Missing(ctx, &a, r, w, []docid.ID{id(t, hex.Hex())}, 0, true); !strings.Contains(x.Detail, "an ObjectId: an _id of another type is another document") {
		t.Errorf("text locked as its ObjectId: %+v", x.Detail)
	}
	if x := l.Missing(ctx, &a, r, w, []docid.ID{id(t, 30)}, 0, true); !strings.Contains(x.Detail, "it holds the lock in shop.shop.orders instead") {
		t.Errorf("doubled namespace: %+v", x.Detail)
	}

	x = l.Missing(ctx, &a, r, w, nil, 2, true)
	if len(x.IDs) != 0 || x.Detail != "this session does not hold the lock on 2 documents its filter matches" {
		t.Errorf("only hidden ids: %+v", x)
	}
	if x := l.Missing(ctx, &a, r, w, []docid.ID{id(t, 10)}, 1, true); x.Detail != "this session does not hold the lock on _id 10, nor on 1 document more that its filter matches" {
		t.Errorf("shown and hidden: %+v", x)
	}
	if e := Refusal(request(t, bson.D{{Key: "update", Value: "orders"}, {Key: "$db", Value: "shop"}}), x); e.Code != mongoerr.LockBusy {
		t.Errorf("refusal code %v", e.Code)
	}
}

// TestInsertable: an insert of an _id another session has locked is
// refused, naming it and its holder; the session's own lock and a free
// _id let it through.
func TestInsertable(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(memstore.Config{})
	l := NewLocks(s)
	a, b := ownerOf(1), ownerOf(2)
	const ns = "shop.orders"
	w := policy.Write{NS: namespace.Of(ns), Kind: policy.KindInsert}
	r := &policy.Rule{Mode: policy.Enforce}
	acquire(t, s, b, ns, id(t, 8))
	acquire(t, s, a, ns, id(t, 9))
	x, checked := l.Insertable(ctx, &a, r, w, []docid.ID{id(t, 7), id(t, 8)})
	if !checked || x == nil || x.Reason != ReasonInsertLocked || x.Holder == nil || len(x.IDs) != 1 || !x.IDs[0].Equal(id(t, 8)) {
		t.Fatalf("locked by another: %+v %v", x, checked)
	}
	if x, _ := l.Insertable(ctx, &a, r, w, []docid.ID{id(t, 7), id(t, 9)}); x != nil {
		t.Fatalf("own and free ids: %+v", x)
	}
}

// TestMemoChecksSeeAFreshReading: a check answered from a held-lock memo
// is for the instant base.Now (HeldMemos.Left measures the lease and the
// cache's trust from it), so at every check of a single id base.Now must
// be no older than anything that may have waited before it: another
// write's check or refusal, an insert's or upsert's reads, the collation
// read of a string (or document) _id, a resolution. Here the decision
// "started" an hour ago; only a lone update of _ids no collation compares
// (nothing can have waited) keeps that reading, every other shape is
// checked at a reading taken in Needs. With startFresh answering true
// for every shape, the memo would be asked about an hour-old instant,
// and a cache confirmed more than its trust ago would still be taken.
func TestMemoChecksSeeAFreshReading(t *testing.T) {
	ctx := context.Background()
	r := &policy.Rule{Mode: policy.Enforce}
	c, d := namespace.Of("db.c"), namespace.Of("db.d")
	upd := policy.Write{Kind: policy.KindUpdate, NS: c}
	upsert := upd
	upsert.Upsert = true
	ins := policy.Write{Kind: policy.KindInsert, NS: c}
	updD := policy.Write{Kind: policy.KindUpdate, NS: d}
	need := func(ns namespace.Namespace, ids ...docid.ID) Need { return Need{NS: ns, Rule: r, IDs: ids} }
	for _, tc := range []struct {
		name   string
		writes []policy.Write
		need   Needs
		zero   bool // a resolution ran (Walk.targets zeroes Now)
		kept   bool // the start is fresh enough
	}{
		{"an update of an int _id", []policy.Write{upd}, Needs{need(c, id(t, 7))}, false, true},
		{"an update of an ObjectId", []policy.Write{upd}, Needs{need(c, id(t, primitive.NewObjectID()))}, false, true},
		{"an update of a string _id", []policy.Write{upd}, Needs{need(c, id(t, "7"))}, false, false},
		{"an update of a document _id", []policy.Write{upd}, Needs{need(c, id(t, bson.D{{Key: "a", Value: 1}}))}, false, false},
		{"an upsert", []policy.Write{upsert}, Needs{need(c, id(t, 7))}, false, false},
		{"an insert", []policy.Write{ins}, Needs{need(c, id(t, 7))}, false, false},
		{"two writes", []policy.Write{upd, updD}, Needs{need(c, id(t, 7)), need(d, id(t, 8))}, false, false},
		{"after a resolution", []policy.Write{upd}, Needs{need(c, id(t, 7))}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now().Add(-time.Hour)
			base := &Verdict{Writes: tc.writes, Now: start}
			if tc.zero {
				base.Now = time.Time{}
			}
			var seen []time.Time
			chk := &Checker[int]{Held: func(_ context.Context, _ int, _ *policy.Rule, _ *lockstore.Owner, _ namespace.Namespace, _ []docid.ID) (bool, []docid.ID, error) {
				seen = append(seen, base.Now)
				return true, nil, nil
			}}
			o := ownerOf(1)
			before := time.Now()
			chk.Needs(ctx, 0, base, &o, tc.need)
			if len(seen) != len(tc.need) {
				t.Fatalf("%d checks, want %d", len(seen), len(tc.need))
			}
			for i, at := range seen {
				if tc.kept {
					if !at.Equal(start) {
						t.Errorf("check %d: at %v, want the start kept", i, at)
					}
				} else if at.Before(before) {
					t.Errorf("check %d is for a reading %s before Needs began", i, before.Sub(at))
				}
			}
		})
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
