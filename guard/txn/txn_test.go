package txn

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

var lsid = bsoncore.NewDocumentBuilder().AppendBinary("id", 4, bytes.Repeat([]byte{7}, 16)).Build()

// request is a transaction command: cmd (commitTransaction,
// abortTransaction or a write's name) with txnNumber n.
func request(t *testing.T, cmd string, n int64, extra ...string) *proxy.Request {
	t.Helper()
	b := bsoncore.NewDocumentBuilder().AppendInt32(cmd, 1)
	if n >= 0 {
		b.AppendInt64("txnNumber", n)
	}
	b.AppendBoolean("autocommit", false).AppendDocument("lsid", lsid).AppendString("$db", "admin")
	msg, err := wire.Parse(wire.AppendMsg(nil, 42, 0, 0, b.Build()), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	return &proxy.Request{Message: msg, Command: c, Client: &proxy.ClientInfo{ID: 1, Addr: "test"}}
}

func ids(t *testing.T, vs ...int) []docid.ID {
	t.Helper()
	var out []docid.ID
	for _, v := range vs {
		id, err := docid.Of(int32(v))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, id)
	}
	return out
}

// rig is a check over an in-memory lock store whose lease, insert and
// launch answers the test sets.
type rig struct {
	check    *Check
	store    *memstore.Store
	key      []byte
	refused  int
	left     time.Duration // LeaseLeft's answer: held with left, when > 0
	lockedBy bool          // Confirmed: another session holds the inserted _ids
	launched []*Commit
	forced   bool // Launch finds a force-release since ForceSeq
	// collated is Collated's answer; asked are the namespaces Confirmed
	// and Collated were asked about.
	collated string
	asked    []string
}

// launchedHook is a launched flight's hook: it hands the reply on, as
// the real one does.
type launchedHook struct{ next proxy.ReplyHook }

func (h launchedHook) Reply(ctx context.Context, body bsoncore.Document) bsoncore.Document {
	return h.next.Reply(ctx, body)
}
func (launchedHook) Abandon() {}

func newRig(t *testing.T, withRecords bool) *rig {
	t.Helper()
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, LeaseMarginMS: 100,
		Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}}})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{store: memstore.New(memstore.Config{}), left: 5 * time.Second}
	sessionKey := func(user string, id []byte) []byte { return append([]byte("k"+user), id...) }
	r.key = sessionKey("", bytes.Repeat([]byte{7}, 16))
	cfg := Config{Policy: func() *policy.Policy { return pol }, SessionKey: sessionKey,
		Owner: func(_ *proxy.Request, id []byte, bind string) lockstore.Owner {
			return lockstore.Owner{Session: sessionKey("", id), Bind: bind}
		},
		LeaseMargin: func(_ *proxy.Request, pol *policy.Policy, ns namespace.Namespace) time.Duration {
			return pol.Lookup(ns).LeaseMargin
		},
		Confirmed: func(_ context.Context, _ lockstore.Owner, ns namespace.Namespace, ids []docid.ID) ([]lockstore.Status, error) {
			r.asked = append(r.asked, "confirmed "+ns.String())
			var out []lockstore.Status
			for _, id := range ids {
				out = append(out, lockstore.Status{ID: id, Held: r.lockedBy})
			}
			return out, nil
		},
		LeaseLeft: func(context.Context, lockstore.Owner, namespace.Namespace, []docid.ID, time.Duration) (time.Duration, bool, error) {
			return r.left, r.left > 0, nil
		},
		Collated: func(_ context.Context, _ lockstore.Owner, ns namespace.Namespace, _ []docid.ID) string {
			r.asked = append(r.asked, "collated "+ns.String())
			return r.collated
		},
		ForceSeq: func() uint64 { return 3 },
		Launch: func(c *Commit, _ time.Duration, next proxy.ReplyHook) proxy.ReplyHook {
			if r.forced {
				return nil
			}
			r.launched = append(r.launched, c)
			return launchedHook{next: next}
		},
		Refused: func() { r.refused++ },
		Log:     zap.NewNop()}
	if withRecords {
		cfg.Store = r.store
	}
	r.check = New(cfg)
	return r
}

// record records a statement of transaction n that needed held and
// inserts unlocked on shop.orders.
func (r *rig) record(t *testing.T, n int64, held, unlocked []docid.ID) *Refusal {
	t.Helper()
	return r.check.Record(context.Background(), request(t, "update", n), r.key,
		[]lockstore.TxnNeed{{NS: namespace.Of("shop.orders"), Held: held, Unlocked: unlocked}})
}

// wantAborted: the commit is not forwarded; abortTransaction of the same
// transaction goes in its place, and the client gets the refusal.
func wantAborted(t *testing.T, r *rig, d proxy.Decision, why string) {
	t.Helper()
	if d.Action != proxy.Rewrite {
		t.Fatalf("commit: action %v, want the abort in its place", d.Action)
	}
	msg, err := wire.Parse(d.Message, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "abortTransaction" || c.Body.Lookup("txnNumber").Int64() != 1 || msg.Header().RequestID != 42 {
		t.Fatalf("sent in the commit's place: %v", c.Body)
	}
	reply := d.OnReply.Reply(context.Background(), bsoncore.NewDocumentBuilder().AppendInt32("ok", 1).Build())
	if code, _ := reply.Lookup("code").AsInt64OK(); code != int64(mongoerr.LockBusy) {
		t.Errorf("client got %v, want LockBusy", reply)
	}
	if msg := reply.Lookup("errmsg").StringValue(); !strings.Contains(msg, "commitTransaction refused: "+why) {
		t.Errorf("errmsg %q, want the reason %q", msg, why)
	}
	if r.refused != 1 {
		t.Errorf("refusals counted: %d, want 1", r.refused)
	}
}

// TestCoveredCommitIsLaunched: a commit whose recorded locks are still
// held with lease beyond the margin is forwarded with maxTimeMS capped,
// as a write in flight under exactly those locks.
func TestCoveredCommitIsLaunched(t *testing.T) {
	r := newRig(t, true)
	if x := r.record(t, 1, ids(t, 1, 2), nil); x != nil {
		t.Fatalf("recording: %+v", x)
	}
	d := r.check.End(context.Background(), request(t, "commitTransaction", 1))
	if len(r.launched) != 1 {
		t.Fatalf("launched %d commits, want 1 (decision %+v)", len(r.launched), d)
	}
	c := r.launched[0]
	if len(c.Locks) != 1 || c.Locks[0].NS.String() != "shop.orders" || len(c.Locks[0].IDs) != 2 || c.Margin != 100*time.Millisecond || c.ForceSeq != 3 {
		t.Errorf("commit launched as %+v", c)
	}
	if d.Action != proxy.Rewrite || d.Deadline.IsZero() || d.LateReply == nil {
		t.Fatalf("decision %+v: want the commit rewritten with its maxTimeMS, a deadline and a late reply", d)
	}
	if _, ok := d.OnReply.(launchedHook); !ok {
		t.Errorf("hook %T, want the flight's", d.OnReply)
	}
	msg, _ := wire.Parse(d.Message, wire.Limits{})
	c2, _ := wire.CommandOf(msg)
	if ms, ok := c2.Body.Lookup("maxTimeMS").AsInt64OK(); !ok || ms <= 0 || ms > 5000 {
		t.Errorf("maxTimeMS %v, want the lease left less the margin", c2.Body.Lookup("maxTimeMS"))
	}
	// The proxy lowers the cap as the commit leaves: it must be told where.
	if ms, ok := d.MaxTime.Get(d.Message); !ok || ms != c2.Body.Lookup("maxTimeMS").Int64() {
		t.Errorf("the cap is not located in the commit (%+v): %d %v", d.MaxTime, ms, ok)
	}
}

// TestUncoveredCommitIsAborted: a commit whose locks were lost is not
// forwarded, and its record stays until the server confirms the abort.
func TestUncoveredCommitIsAborted(t *testing.T) {
	r := newRig(t, true)
	r.record(t, 1, ids(t, 1), nil)
	r.left = 0
	d := r.check.End(context.Background(), request(t, "commitTransaction", 1))
	wantAborted(t, r, d, "this session no longer holds")
	if len(r.launched) != 0 {
		t.Error("an uncovered commit was launched")
	}
}

// TestCommitForceReleasedMeanwhileIsAborted: an operator's force-release
// during the check refuses the commit at its launch.
func TestCommitForceReleasedMeanwhileIsAborted(t *testing.T) {
	r := newRig(t, true)
	r.record(t, 1, ids(t, 1), nil)
	r.forced = true
	wantAborted(t, r, r.check.End(context.Background(), request(t, "commitTransaction", 1)), "an operator force-released")
}

// TestCommitOfAnInsertOfALockedIDIsAborted: _ids the transaction inserts
// must still be unlocked by others at its commit.
func TestCommitOfAnInsertOfALockedIDIsAborted(t *testing.T) {
	r := newRig(t, true)
	r.record(t, 1, nil, ids(t, 9))
	r.lockedBy = true
	wantAborted(t, r, r.check.End(context.Background(), request(t, "commitTransaction", 1)), "another session has locked _id 9")
}

// TestCommitOfAnInsertUnderACollationIsChecked: a lock taken since the
// statement on an _id the namespace's collation may take for an inserted
// one ("c" for "C") refuses the commit as it refused the statement; the
// commit re-checked inserted _ids exactly only before, and was launched.
// Without the collation check (Collated nil), a commit that inserts is
// refused (fail closed).
func TestCommitOfAnInsertUnderACollationIsChecked(t *testing.T) {
	r := newRig(t, true)
	r.record(t, 1, nil, ids(t, 9))
	r.collated = "another session has locked an _id the collation may take for 9"
	wantAborted(t, r, r.check.End(context.Background(), request(t, "commitTransaction", 1)), r.collated)
	if want := []string{"confirmed shop.orders", "collated shop.orders"}; !slices.Equal(r.asked, want) {
		t.Errorf("asked %v, want %v", r.asked, want)
	}

	r = newRig(t, true)
	r.check.cfg.Collated = nil
	r.record(t, 1, nil, ids(t, 9))
	wantAborted(t, r, r.check.End(context.Background(), request(t, "commitTransaction", 1)), "this proxy cannot check the _ids it inserts into shop.orders under that collection's collation")
}

// TestCommitOfAnInsertIntoACaseVariantIsChecked: an insert into
// SHOP.orders, a case variant of the protected shop.orders, is checked at
// its commit against shop.orders's locks, where they are taken (a server
// that folds database names writes shop.orders for it); it was checked
// under SHOP.orders, where no lock can be, before.
func TestCommitOfAnInsertIntoACaseVariantIsChecked(t *testing.T) {
	r := newRig(t, true)
	if x := r.check.Record(context.Background(), request(t, "insert", 1), r.key,
		[]lockstore.TxnNeed{{NS: namespace.Of("SHOP.orders"), Unlocked: ids(t, 9)}}); x != nil {
		t.Fatalf("recording: %+v", x)
	}
	r.lockedBy = true
	wantAborted(t, r, r.check.End(context.Background(), request(t, "commitTransaction", 1)), "another session has locked _id 9, which it inserts into SHOP.orders")
	if want := []string{"confirmed shop.orders"}; !slices.Equal(r.asked, want) {
		t.Errorf("asked %v, want %v", r.asked, want)
	}
}

// TestStatementAfterTheCommitBeganIsRefused: once a commit has read the
// record, no statement of its transaction can be added to it; the record
// is forgotten when the server answers the commit with ok, and not when
// it answers with an error.
func TestStatementAfterTheCommitBeganIsRefused(t *testing.T) {
	r := newRig(t, true)
	r.record(t, 1, ids(t, 1), nil)
	d := r.check.End(context.Background(), request(t, "abortTransaction", 1))
	if d.Action != proxy.Forward || d.OnReply == nil {
		t.Fatalf("abort: %+v, want forwarded with the hook that forgets", d)
	}
	d = r.check.End(context.Background(), request(t, "commitTransaction", 1))
	x := r.record(t, 1, ids(t, 2), nil)
	if x == nil || x.Reason != ReasonCommitNotCovered || x.NS.String() != "shop.orders" {
		t.Fatalf("statement after the commit began: %+v, want refused", x)
	}
	d.OnReply.Reply(context.Background(), bsoncore.NewDocumentBuilder().AppendInt32("ok", 0).Build())
	if x := r.record(t, 1, ids(t, 2), nil); x == nil {
		t.Fatal("a failed commit's record was forgotten")
	}
	d.OnReply.Reply(context.Background(), bsoncore.NewDocumentBuilder().AppendInt32("ok", 1).Build())
	if x := r.record(t, 1, ids(t, 2), nil); x != nil {
		t.Fatalf("after the commit's ok: %+v, want the record forgotten", x)
	}
}

// TestWithoutTransactionRecordsEverythingFailsClosed: a lock store that
// keeps no records refuses enforced statements in transactions and their
// commits; aborts pass.
func TestWithoutTransactionRecordsEverythingFailsClosed(t *testing.T) {
	r := newRig(t, false)
	if x := r.record(t, 1, ids(t, 1), nil); x == nil || x.Reason != refuse.ReasonUnavailable {
		t.Errorf("statement: %+v, want refused as unavailable", x)
	}
	if d := r.check.End(context.Background(), request(t, "abortTransaction", 1)); d.Action != proxy.Forward || d.OnReply != nil {
		t.Errorf("abort: %+v, want forwarded as it came", d)
	}
	wantAborted(t, r, r.check.End(context.Background(), request(t, "commitTransaction", 1)), "this lock store keeps no transaction records")
}

// TestStatementWithoutTxnNumberIsRefused: its commit could not be found.
func TestStatementWithoutTxnNumberIsRefused(t *testing.T) {
	r := newRig(t, true)
	x := r.check.Record(context.Background(), request(t, "update", -1), r.key, []lockstore.TxnNeed{{NS: namespace.Of("shop.orders"), Held: ids(t, 1)}})
	if x == nil || x.Reason != refuse.ReasonUnavailable || !strings.Contains(x.Detail, "without a txnNumber") {
		t.Errorf("%+v, want refused", x)
	}
	if x := r.check.Record(context.Background(), request(t, "update", -1), r.key, nil); x != nil {
		t.Errorf("a statement that needs nothing: %+v, want nothing to record", x)
	}
}

// TestLockStoreFailureAbortsTheCommit: what the commit needs cannot be read.
func TestLockStoreFailureAbortsTheCommit(t *testing.T) {
	r := newRig(t, true)
	r.record(t, 1, ids(t, 1), nil)
	r.store.SetUnavailable(errors.New("down"))
	wantAborted(t, r, r.check.End(context.Background(), request(t, "commitTransaction", 1)), "the lock store cannot tell")
}

func TestIn(t *testing.T) {
	body := func(b *bsoncore.DocumentBuilder) *wire.Command {
		msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, b.AppendString("$db", "shop").Build()), wire.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		c, err := wire.CommandOf(msg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if !In(body(bsoncore.NewDocumentBuilder().AppendString("update", "c").AppendBoolean("autocommit", false))) {
		t.Error("autocommit: false is in a transaction")
	}
	if In(body(bsoncore.NewDocumentBuilder().AppendString("update", "c"))) || In(body(bsoncore.NewDocumentBuilder().AppendString("update", "c").AppendBoolean("autocommit", true))) {
		t.Error("without autocommit: false, not in a transaction")
	}
}
