package fence

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

// stampsDB holds the stamp of each document by id.
type stampsDB map[int32]int64

func (db stampsDB) StampFence(context.Context, namespace.Namespace, string, []docid.ID, []int64) error {
	return nil
}

func (db stampsDB) FenceStamps(_ context.Context, _ namespace.Namespace, _ string, ids []docid.ID) ([]bson.RawValue, []bool, error) {
	stamps, exists := make([]bson.RawValue, len(ids)), make([]bool, len(ids))
	for i, id := range ids {
		for k, t := range db {
			if want, _ := docid.Of(k); want.Equal(id) {
				_, v, _ := bson.MarshalValue(t)
				stamps[i], exists[i] = bson.RawValue{Type: bson.TypeInt64, Value: v}, true
			}
		}
	}
	return stamps, exists, nil
}

func id(t *testing.T, v int32) docid.ID {
	t.Helper()
	d, err := docid.Of(v)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func updateReply(n int32) bsoncore.Document {
	return bsoncore.NewDocumentBuilder().AppendInt32("n", n).AppendInt32("nModified", n).AppendDouble("ok", 1).Build()
}

// TestHookTellsFencedOutFromNoMatch: a statement that matched nothing on a
// document a newer holder stamped becomes a write error at its index,
// naming the tokens; one whose document carries the writer's own token
// (it matched nothing for its own reasons) and a full reply pass as the
// database sent them.
func TestHookTellsFencedOutFromNoMatch(t *testing.T) {
	out := prometheus.NewCounter(prometheus.CounterOpts{Name: "fenced_out"})
	hook := func(db DB) *Hook {
		return &Hook{DB: db, Command: "update", Log: zap.NewNop(), FencedOut: out, Checks: []Check{
			{Index: 0, NS: namespace.Of("shop.orders"), Field: "_fence", IDs: []docid.ID{id(t, 7)}, Tokens: []int64{5}, Named: []bool{true}},
		}}
	}
	ctx := context.Background()
	if r := hook(stampsDB{7: 9}).Reply(ctx, updateReply(1)); r != nil {
		t.Errorf("a write that matched its document was changed: %v", r)
	}
	if r := hook(stampsDB{7: 5}).Reply(ctx, updateReply(0)); r != nil {
		t.Errorf("a write that matched nothing under its own token was changed: %v", r)
	}
	r := hook(stampsDB{7: 9}).Reply(ctx, updateReply(0))
	if r == nil {
		t.Fatal("a write fenced out by a newer holder's stamp passed as a no-match")
	}
	msg, _ := r.Lookup("writeErrors", "0", "errmsg").StringValueOK()
	reason, _ := r.Lookup("writeErrors", "0", "errInfo", "lockgate", "reason").StringValueOK()
	if reason != ReasonFencedOut || !strings.Contains(msg, "token 5") || !strings.Contains(msg, "token 9") {
		t.Errorf("fenced-out reply %v", r)
	}
	if n := testutil.ToFloat64(out); n != 1 {
		t.Errorf("fenced out counted %v, want 1", n)
	}
}

// TestStampToken: only an integral number is a token.
func TestStampToken(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want bool
	}{{int32(3), true}, {int64(3), true}, {3.0, true}, {3.5, false}, {"3", false}, {primitive.Null{}, false}} {
		typ, b, err := bson.MarshalValue(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := StampToken(bson.RawValue{Type: typ, Value: b}); ok != tc.want {
			t.Errorf("StampToken(%v) = %v, want %v", tc.v, ok, tc.want)
		}
	}
}
