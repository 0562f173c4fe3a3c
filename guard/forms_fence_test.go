package guard_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard"
	"github.com/lockgate/lockgate/guard/fence"
	"github.com/lockgate/lockgate/guard/guardtest"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// The forms of writes on a fenced namespace (fence: document), decided
// by a whole guard over the in-memory lock store and a resolver that
// keeps the stamps acquireLock writes (fenceDB), and held to a model of
// docs/ENFORCEMENT.md, "Document fence", and docs/ERRORS.md: a bulkWrite
// is refused (fence_unsupported); a write whose session does not hold
// every lock is refused as anywhere; a held write that would change the
// fence field ($inc, $unset, a path below it, $rename to it) or a
// pipeline or replacement that may cover documents locked under
// different tokens is refused (fence_field); any other held write leaves
// with every statement restricted to the fence field's current token.
// The fence's part in guard/enforce, being told each statement's
// documents, is TestAllowEveryForm's.

const fenceField = "lockToken"

// fenceDB is guardtest's resolver with the stamps of the fence.
type fenceDB struct {
	*guardtest.Resolver
	mu     sync.Mutex
	stamps map[docid.Key]int64 // token per document
}

func (f *fenceDB) StampFence(_ context.Context, ns namespace.Namespace, _ string, ids []docid.ID, tokens []int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, id := range ids {
		f.stamps[docid.KeyOf(ns, id)] = max(f.stamps[docid.KeyOf(ns, id)], tokens[i])
	}
	return nil
}

func (f *fenceDB) FenceStamps(_ context.Context, ns namespace.Namespace, _ string, ids []docid.ID) ([]bson.RawValue, []bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	stamps, exists := make([]bson.RawValue, len(ids)), make([]bool, len(ids))
	for i, id := range ids {
		if t, ok := f.stamps[docid.KeyOf(ns, id)]; ok {
			ty, b, _ := bson.MarshalValue(t)
			stamps[i] = bson.RawValue{Type: ty, Value: b}
		}
		exists[i] = true
	}
	return stamps, exists, nil
}

var _ fence.DB = (*fenceDB)(nil)

type fenceStmt struct {
	op     string // set, setFence, incFence, unsetFence, setBelow, renameTo, replace, pipeline, delete
	filter string // id, in
	ids    []int
}

type fenceCase struct {
	cmd   string // update, delete, findAndModify, bulkWrite
	stmts []fenceStmt
	locks map[int]int // _id -> 0 free, 1 the caller's, 2 another session's
	// stale are the _ids a newer holder stamps while the allowed write is
	// on its way (checkStale).
	stale []int
}

func (c fenceCase) String() string {
	return fmt.Sprintf("%s locks=%v stmts=%+v stale=%v", c.cmd, c.locks, c.stmts, c.stale)
}

func (s fenceStmt) filterDoc() bson.D {
	if s.filter == "id" {
		return bson.D{{Key: "_id", Value: s.ids[0]}}
	}
	var in bson.A
	for _, i := range s.ids {
		in = append(in, i)
	}
	return bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: in}}}}
}

func (s fenceStmt) update() any {
	n := bson.D{{Key: "n", Value: 1}}
	switch s.op {
	case "setFence":
		return bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 1}, {Key: fenceField, Value: int64(1)}}}}
	case "incFence":
		return bson.D{{Key: "$inc", Value: bson.D{{Key: fenceField, Value: 1}}}}
	case "unsetFence":
		return bson.D{{Key: "$unset", Value: bson.D{{Key: fenceField, Value: ""}}}}
	case "setBelow":
		return bson.D{{Key: "$set", Value: bson.D{{Key: fenceField + ".x", Value: 1}}}}
	case "renameTo":
		return bson.D{{Key: "$rename", Value: bson.D{{Key: "n", Value: fenceField}}}}
	case "replace":
		return n
	case "pipeline":
		return bson.A{bson.D{{Key: "$set", Value: n}}}
	}
	return bson.D{{Key: "$set", Value: n}}
}

func (c fenceCase) body() bson.D {
	var b bson.D
	switch c.cmd {
	case "update":
		var us bson.A
		for _, s := range c.stmts {
			us = append(us, bson.D{{Key: "q", Value: s.filterDoc()}, {Key: "u", Value: s.update()}, {Key: "multi", Value: s.op != "replace"}})
		}
		b = bson.D{{Key: "update", Value: "orders"}, {Key: "updates", Value: us}}
	case "delete":
		var ds bson.A
		for _, s := range c.stmts {
			ds = append(ds, bson.D{{Key: "q", Value: s.filterDoc()}, {Key: "limit", Value: 0}})
		}
		b = bson.D{{Key: "delete", Value: "orders"}, {Key: "deletes", Value: ds}}
	case "findAndModify":
		s := c.stmts[0]
		b = bson.D{{Key: "findAndModify", Value: "orders"}, {Key: "query", Value: s.filterDoc()}}
		if s.op == "delete" {
			b = append(b, bson.E{Key: "remove", Value: true})
		} else {
			b = append(b, bson.E{Key: "update", Value: s.update()})
		}
	default:
		var ops bson.A
		for _, s := range c.stmts {
			if s.op == "delete" {
				ops = append(ops, bson.D{{Key: "delete", Value: 0}, {Key: "filter", Value: s.filterDoc()}, {Key: "multi", Value: true}})
			} else {
				ops = append(ops, bson.D{{Key: "update", Value: 0}, {Key: "filter", Value: s.filterDoc()}, {Key: "updateMods", Value: s.update()}, {Key: "multi", Value: s.op != "replace"}})
			}
		}
		return bson.D{{Key: "bulkWrite", Value: 1}, {Key: "ops", Value: ops}, {Key: "nsInfo", Value: bson.A{bson.D{{Key: "ns", Value: "shop.orders"}}}},
			{Key: "$db", Value: "admin"}, {Key: "lsid", Value: implicitSession(0xa)}}
	}
	return append(b, bson.E{Key: "$db", Value: "shop"}, bson.E{Key: "lsid", Value: implicitSession(0xa)})
}

// expect is the model: the reasons it may be refused with, none if
// allowed. Every _id is locked by its own acquireLock, so documents of
// two _ids carry different tokens.
func (c fenceCase) expect() []string {
	var reasons []string
	if c.cmd == "bulkWrite" {
		reasons = append(reasons, "fence_unsupported")
	}
	held := true
	for _, s := range c.stmts {
		for _, i := range s.ids {
			held = held && c.locks[i] == 1
		}
	}
	if !held {
		return append(reasons, "not_locked", "held_by_other")
	}
	if reasons != nil {
		return reasons
	}
	for _, s := range c.stmts {
		switch s.op {
		case "incFence", "unsetFence", "setBelow", "renameTo":
			reasons = append(reasons, "fence_field")
		case "replace", "pipeline":
			if len(s.ids) > 1 {
				reasons = append(reasons, "fence_field")
			}
		}
	}
	return reasons
}

func fenceGuard(t *testing.T) (*guard.Guard, *fenceDB) {
	t.Helper()
	db := &fenceDB{Resolver: guardtest.NewResolver(), stamps: map[docid.Key]int64{}}
	for i := 1; i <= 6; i++ {
		if err := db.Insert("shop.orders", bson.D{{Key: "_id", Value: i}}); err != nil {
			t.Fatal(err)
		}
	}
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, MaxCandidates: 3, Namespaces: []config.NamespaceRule{
		{Match: "shop.orders", Mode: config.ModeEnforce, Fence: config.FenceDocument, FenceField: fenceField}}})
	if err != nil {
		t.Fatal(err)
	}
	g := guard.New(guard.Options{Store: memstore.New(memstore.Config{DefaultLease: 30 * time.Second, MaxLease: time.Minute}), Resolver: db,
		Reserved: guard.ReservedFor("lockgate", "locks"), OwnerSecret: []byte("forms-fence-owner-secret-0123456"), Logger: zap.NewNop(), OrderTimeout: time.Second})
	g.SetPolicy(pol)
	return g, db
}

// stamp is the token _id i of shop.orders carries.
func (f *fenceDB) stamp(i int) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stamps[ordersKey(i)]
}

func ordersKey(i int) docid.Key {
	id, err := docid.Of(int32(i))
	if err != nil {
		panic(err)
	}
	return docid.KeyOf(namespace.Of("shop.orders"), id)
}

// overtake stamps _id i with a token above its holder's, as a newer
// holder's acquireLock through another lockgate would while the write is
// on its way.
func (f *fenceDB) overtake(i int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stamps[ordersKey(i)]++
}

// fenceTokens are the tokens a filter's fence clauses ({field: {$in:
// [token, null], ...}}, at any depth of $and/$or) let through.
func fenceTokens(d bsoncore.Document) map[int64]bool {
	out := map[int64]bool{}
	var walk func(v bsoncore.Value, key string)
	walk = func(v bsoncore.Value, key string) {
		if key == fenceField {
			if in, err := v.Document().LookupErr("$in"); err == nil {
				vals, _ := in.Array().Values()
				for _, t := range vals {
					if n, ok := t.Int64OK(); ok {
						out[n] = true
					}
				}
			}
			return
		}
		var elems []bsoncore.Element
		switch v.Type {
		case bson.TypeEmbeddedDocument:
			elems, _ = v.Document().Elements()
		case bson.TypeArray:
			elems, _ = bsoncore.Document(v.Array()).Elements()
		}
		for _, e := range elems {
			walk(e.Value(), e.Key())
		}
	}
	walk(bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: d}, "")
	return out
}

// fenceWritten is the token a statement's update writes into the fence
// field, false when it writes none: an operator update's $set, a
// replacement's field, a pipeline's last $set of a $literal.
func fenceWritten(u bsoncore.Value) (int64, bool) {
	var v bsoncore.Value
	var err error
	switch u.Type {
	case bson.TypeEmbeddedDocument:
		d := u.Document()
		if first, ferr := d.IndexErr(0); ferr == nil && strings.HasPrefix(first.Key(), "$") {
			v, err = d.LookupErr("$set", fenceField)
		} else {
			v, err = d.LookupErr(fenceField)
		}
	case bson.TypeArray:
		stages, _ := u.Array().Values()
		if len(stages) == 0 {
			return 0, false
		}
		v, err = stages[len(stages)-1].Document().LookupErr("$set", fenceField, "$literal")
	default:
		return 0, false
	}
	if err != nil {
		return 0, false
	}
	return v.Int64OK()
}

func checkFenceCase(t *testing.T, c fenceCase) {
	t.Helper()
	g, db := fenceGuard(t)
	for i, st := range c.locks {
		if st == 0 {
			continue
		}
		if d := acquireImplicit(t, g, 1, map[int]byte{1: 0xa, 2: 0xb}[st], []int{i}); !replyOK(d) {
			t.Fatalf("acquireLock %d: %s", i, d.Reply)
		}
	}
	reasons := c.expect()
	d := implicitIntercept(t, g, 2, c.body())
	if len(reasons) > 0 {
		reason, _ := d.Reply.Lookup("lockgate", "reason").StringValueOK()
		if d.Action != proxy.Reply || replyOK(d) || !slices.Contains(reasons, reason) {
			t.Fatalf("%s\ndecision %v %s; want refused with one of %v", c, d.Action, d.Reply, reasons)
		}
		return
	}
	if d.Action != proxy.Rewrite {
		t.Fatalf("%s\ndecision %v %s; want allowed, restricted to the fence", c, d.Action, d.Reply)
	}
	m, err := wire.Parse(d.Message, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(m)
	if err != nil {
		t.Fatal(err)
	}
	writes, err := policy.Classify(m, cmd)
	if err != nil || len(writes) != len(c.stmts) {
		t.Fatalf("%s\nthe forwarded message reads as %d writes (%v)", c, len(writes), err)
	}
	// Each statement applies only where its documents carry the tokens
	// their holder's acquireLock stamped, and writes that token where it
	// can carry one (one _id): the holder's write lands and keeps the
	// document stamped.
	for i, w := range writes {
		st := c.stmts[i]
		want := map[int64]bool{}
		for _, id := range st.ids {
			want[db.stamp(id)] = true
		}
		if got := fenceTokens(w.Filter); !maps.Equal(got, want) {
			t.Fatalf("%s\nstatement %d leaves with filter %s, fenced to tokens %v; the holder's are %v", c, i, w.Filter, got, want)
		}
		tok, written := fenceWritten(w.Update)
		switch {
		case st.op == "delete":
			if written {
				t.Fatalf("%s\nstatement %d, a delete, writes the fence field", c, i)
			}
		case len(st.ids) == 1:
			if !written || tok != db.stamp(st.ids[0]) {
				t.Fatalf("%s\nstatement %d writes %s into the fence field (written=%v, token %d), want its holder's token %d", c, i, w.Update, written, tok, db.stamp(st.ids[0]))
			}
		case written:
			t.Fatalf("%s\nstatement %d over documents locked under different tokens writes token %d into the fence field", c, i, tok)
		}
	}
	checkStale(t, c, d, db)
}

// checkStale answers the allowed write of c as the database would once
// c.stale's documents were stamped by a newer holder (their filters no
// longer match): a statement that met one is reported fenced out, at its
// index (findAndModify: as the command's error), and a write that met
// none is relayed unchanged.
func checkStale(t *testing.T, c fenceCase, d proxy.Decision, db *fenceDB) {
	t.Helper()
	for _, i := range c.stale {
		db.overtake(i)
	}
	isStale := func(i int) bool { return slices.Contains(c.stale, i) }
	wantIdx := map[int]bool{}
	n := 0
	for k, st := range c.stmts {
		matched := 0
		for _, id := range st.ids {
			if !isStale(id) {
				matched++
			}
		}
		if st.op == "replace" || c.cmd == "findAndModify" {
			// One document at most: the database writes another it
			// names where one was overtaken, and is fenced out only when
			// every one was.
			wantIdx[k] = matched == 0
			matched = min(matched, 1)
		} else {
			wantIdx[k] = matched < len(st.ids)
		}
		if !wantIdx[k] {
			delete(wantIdx, k)
		}
		n += matched
	}
	var reply bson.D
	if c.cmd == "findAndModify" {
		reply = bson.D{{Key: "lastErrorObject", Value: bson.D{{Key: "n", Value: n}}}, {Key: "value", Value: nil}, {Key: "ok", Value: 1}}
	} else {
		reply = bson.D{{Key: "n", Value: n}, {Key: "ok", Value: 1}}
	}
	raw, err := bson.Marshal(reply)
	if err != nil {
		t.Fatal(err)
	}
	got := d.OnReply.Reply(context.Background(), raw)
	if len(wantIdx) == 0 {
		if got != nil && strings.Contains(got.String(), "fenced_out") {
			t.Fatalf("%s\nno document was overtaken, yet the reply became %s", c, got)
		}
		return
	}
	if got == nil {
		t.Fatalf("%s\n_ids %v were stamped by a newer holder under the write, and its reply %s was relayed as it came", c, c.stale, bson.Raw(raw))
	}
	if c.cmd == "findAndModify" {
		reason, _ := got.Lookup("lockgate", "reason").StringValueOK()
		if code, _ := got.Lookup("code").AsInt64OK(); code != 46 || reason != "fenced_out" {
			t.Fatalf("%s\nthe stale holder's findAndModify got %s, want LockBusy fenced_out", c, got)
		}
		return
	}
	errs, _ := got.Lookup("writeErrors").Array().Values()
	gotIdx := map[int]bool{}
	for _, e := range errs {
		i, _ := e.Document().Lookup("index").AsInt64OK()
		reason, _ := e.Document().Lookup("errInfo", "lockgate", "reason").StringValueOK()
		if code, _ := e.Document().Lookup("code").AsInt64OK(); code != 46 || reason != "fenced_out" {
			t.Fatalf("%s\nwrite error %s, want LockBusy fenced_out", c, e)
		}
		gotIdx[int(i)] = true
	}
	if !maps.Equal(gotIdx, wantIdx) {
		t.Fatalf("%s\nfenced out at statements %v, want %v (reply %s)", c, gotIdx, wantIdx, got)
	}
}

func genFenceCase(r *rand.Rand) fenceCase {
	c := fenceCase{cmd: []string{"update", "delete", "findAndModify", "bulkWrite"}[r.IntN(4)], locks: map[int]int{}}
	for i := 1; i <= 6; i++ {
		c.locks[i] = []int{0, 1, 1, 1, 1, 2}[r.IntN(6)]
	}
	n := 1 + r.IntN(2)
	if c.cmd == "findAndModify" {
		n = 1
	}
	for range n {
		s := fenceStmt{filter: []string{"id", "in"}[r.IntN(2)]}
		s.ids = []int{1 + r.IntN(6)}
		if s.filter == "in" {
			s.ids = append(s.ids, 1+r.IntN(6))
			slices.Sort(s.ids)
			s.ids = slices.Compact(s.ids)
		}
		switch c.cmd {
		case "delete":
			s.op = "delete"
		case "update":
			s.op = []string{"set", "set", "setFence", "incFence", "unsetFence", "setBelow", "renameTo", "replace", "pipeline"}[r.IntN(9)]
		default:
			s.op = []string{"set", "setFence", "incFence", "replace", "pipeline", "delete"}[r.IntN(6)]
		}
		c.stmts = append(c.stmts, s)
	}
	return c
}

// genStale picks, for half the cases, some of the _ids c names for a
// newer holder to stamp while c's write is on its way.
func genStale(r *rand.Rand, c fenceCase) []int {
	var named []int
	for _, s := range c.stmts {
		named = append(named, s.ids...)
	}
	slices.Sort(named)
	named = slices.Compact(named)
	if r.IntN(2) == 0 {
		return nil
	}
	var out []int
	for _, i := range named {
		if r.IntN(2) == 0 {
			out = append(out, i)
		}
	}
	if len(out) == 0 {
		out = named[:1]
	}
	return out
}

// TestFencedForms: writes of every form on a fenced namespace, decided
// as the model says; an allowed one is fenced to its holder's tokens,
// writes the token, and is reported fenced out where a newer holder
// stamped a document under it. Fixed seeds.
func TestFencedForms(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 2026))
	tally := map[string]int{}
	stale := rand.New(rand.NewPCG(12, 2026)) // apart, so that the seed's cases stay as they were
	cases, full := formCases(800)
	for i := range cases {
		c := genFenceCase(r)
		c.stale = genStale(stale, c)
		reasons := c.expect()
		key := "allowed"
		if len(reasons) > 0 {
			key = reasons[0]
		}
		tally[c.cmd+" "+key]++
		if len(reasons) == 0 && len(c.stale) > 0 {
			tally[c.cmd+" stale"]++
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) { checkFenceCase(t, c) })
		if t.Failed() {
			return
		}
	}
	t.Logf("%v", tally)
	if !full {
		return
	}
	for _, k := range []string{"update allowed", "update fence_field", "update not_locked", "delete allowed", "findAndModify allowed",
		"findAndModify fence_field", "bulkWrite fence_unsupported", "update stale", "delete stale", "findAndModify stale"} {
		if tally[k] < 10 {
			t.Errorf("only %d cases of %s", tally[k], k)
		}
	}
}
