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
