package enforce

import (
	"context"
	"testing"
	"time"

	"github.com/lockgate/lockgate/guard/authority"
	"github.com/lockgate/lockgate/guard/guardtest"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// TestPinMemoAnswersOnlyTheSameFilter: the connection's memo of pinned
// filters (PinMemos) answers a filter only with what reading it would
// find: never another id's (same length, one byte apart), never across a
// change of maxCandidates, never from bytes the request's buffer held
// before it was reused, and never past a collation that makes a string
// _id match other documents.
func TestPinMemoAnswersOnlyTheSameFilter(t *testing.T) {
	res := guardtest.NewResolver()
	var memo PinMemos
	targets := NewTargets(TargetsConfig{Resolver: res, ResolveTimeout: time.Second, Authority: authority.New(nil),
		Throttle: &fakeThrottle{slots: make(chan struct{}, 1)}, PinMemos: func(*proxy.Request) *PinMemos { return &memo },
		Resolves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "resolves"}, []string{"outcome"}),
		Seconds:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seconds"})})
	req := &proxy.Request{Client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}}
	of := func(r policy.Rule, w policy.Write) Target {
		var buf [1]bsoncore.Value
		var x Target
		targets.Of(context.Background(), req, &r, &w, false, false, buf[:0], &x)
		return x
	}

	for range 2 { // the second round answered from the memo
		sameIDs(t, "_id 7", of(enforced, update(t, bson.D{{Key: "_id", Value: 7}})).IDs, 7)
		sameIDs(t, "_id 8", of(enforced, update(t, bson.D{{Key: "_id", Value: 8}})).IDs, 8)
	}
	if memo.m[0].ids == nil {
		t.Fatal("nothing was memoized: the test proves nothing")
	}

	// The request's buffer is the proxy's, reused for the next message:
	// the memo keeps bytes of its own.
	w := update(t, bson.D{{Key: "_id", Value: 9}})
	sameIDs(t, "_id 9", of(enforced, w).IDs, 9)
	copy(w.Filter, raw(t, bson.D{{Key: "_id", Value: 10}}))
	sameIDs(t, "_id 10 in the reused buffer", of(enforced, w).IDs, 10)

	// {_id: {$in: [7]}} pins 7 under maxCandidates 1, and is over 0.
	in := update(t, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{7}}}}})
	one := enforced
	one.MaxCandidates = 1
	sameIDs(t, "$in [7] under maxCandidates 1", of(one, in).IDs, 7)
	none := enforced
	none.MaxCandidates = 0
	if x := of(none, in); x.OK || x.Reason != ReasonTooManyCandidates {
		t.Fatalf("$in [7] under maxCandidates 0, after the memo had it under 1: %+v", x)
	}

	// A string _id pins only under a simple collation, asked on every
	// write: the collection's default changed since the memo had it.
	abc := update(t, bson.D{{Key: "_id", Value: "abc"}})
	sameIDs(t, "\"abc\" under the simple collation", of(enforced, abc).IDs, "abc")
	res.SetCollation("shop.orders", "en")
	if x := of(enforced, abc); !x.Later || x.OK {
		t.Fatalf("a string _id memoized under the simple collation was taken as pinned under a case-folding one: %+v", x)
	}
}

// TestPinMemoAnswersUpsertsAsReading: an upsert whose filter the memo
// knows is decided as one whose filter is read afresh: the _id it would
// insert named (Upserted) and among the ids to lock, or the write refused
// where that _id cannot be known. The memo's answer skips Of's reading of
// the filter, not the upsert's own check (Targets.Of's usual path).
func TestPinMemoAnswersUpsertsAsReading(t *testing.T) {
	targets, memo := memoTargets()
	req := &proxy.Request{Client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}}
	fresh := newTargets(t, true) // no memo: every filter read
	upsert := func(update bsoncore.Value) policy.Write {
		w := update7(t)
		w.Upsert = true
		if update.Data != nil {
			w.Update = update
		}
		return w
	}
	writes := map[string]policy.Write{
		"update":                 update7(t),
		"upsert":                 upsert(bsoncore.Value{}),
		"upsert setting _id":     upsert(bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: raw(t, bson.D{{Key: "$set", Value: bson.D{{Key: "_id", Value: 9}}}})}),
		"pipeline upsert":        upsert(bsoncore.Value{Type: bson.TypeArray, Data: raw(t, bson.D{{Key: "0", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 1}}}}}})}),
		"pipeline upsert of _id": upsert(bsoncore.Value{Type: bson.TypeArray, Data: raw(t, bson.D{{Key: "0", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "_id", Value: 9}}}}}})}),
	}
	upserted := 0
	for round := range 2 { // the second round all answered from the memo
		for what, w := range writes {
			want := fresh.of(enforced, w, false, false)
			var buf [1]bsoncore.Value
			var got Target
			targets.Of(context.Background(), req, &enforced, &w, false, false, buf[:0], &got)
			if got.OK != want.OK || got.Later != want.Later || got.Reason != want.Reason || got.HasUpserted != want.HasUpserted ||
				(want.HasUpserted && !got.Upserted.Equal(want.Upserted)) || len(got.IDs) != len(want.IDs) {
				t.Fatalf("round %d, %s: from the memo %+v, read afresh %+v", round, what, got, want)
			}
			for i := range want.IDs {
				if !got.IDs[i].Equal(want.IDs[i]) {
					t.Fatalf("round %d, %s: ids %v from the memo, %v read afresh", round, what, got.IDs, want.IDs)
				}
			}
			if want.HasUpserted {
				upserted++
			}
		}
	}
	if memo.m[0].ids == nil || upserted == 0 {
		t.Fatalf("nothing memoized (%v) or no upsert named its _id (%d): the test proves nothing", memo.m[0].ids, upserted)
	}
}

// update7 is an update of shop.orders whose filter pins _id 7.
func update7(t *testing.T) policy.Write { return update(t, bson.D{{Key: "_id", Value: 7}}) }

// TestPinMemoKeepsOnlySingleIDFilters: the connection's memo of pinned
// filters keeps a filter only when it pins one _id (it keeps that one
// id): a filter pinning two, written again, still needs both locks.
// Mutant: PinMemos.put keeping any filter (len(ids) < 1), which kept
// {_id: {$in: [7, 8]}} as pinning 7 alone, so its second write went
// through with only 7 locked.
func TestPinMemoKeepsOnlySingleIDFilters(t *testing.T) {
	targets, memo := memoTargets()
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

// memoTargets is targeting with one connection's pin memo (the second
// result), for every request, and a resolver that finds nothing.
func memoTargets() (*Targets, *PinMemos) {
	memo := new(PinMemos)
	return NewTargets(TargetsConfig{Resolver: guardtest.NewResolver(), ResolveTimeout: time.Second, Authority: authority.New(nil),
		Throttle: &fakeThrottle{slots: make(chan struct{}, 1)}, PinMemos: func(*proxy.Request) *PinMemos { return memo },
		Resolves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "resolves"}, []string{"outcome"}),
		Seconds:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seconds"})}), memo
}
