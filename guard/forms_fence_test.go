package guard_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
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
}

func (c fenceCase) String() string {
	return fmt.Sprintf("%s locks=%v stmts=%+v", c.cmd, c.locks, c.stmts)
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

func fenceGuard(t *testing.T) *guard.Guard {
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
	return g
}

func checkFenceCase(t *testing.T, c fenceCase) {
	t.Helper()
	g := fenceGuard(t)
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
	for i, w := range writes {
		if !strings.Contains(w.Filter.String(), fenceField) {
			t.Fatalf("%s\nstatement %d leaves with filter %s, not restricted to the fence field's token", c, i, w.Filter)
		}
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

// TestFencedForms: writes of every form on a fenced namespace, decided
// as the model says. Fixed seed.
func TestFencedForms(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 2026))
	tally := map[string]int{}
	for i := range 800 {
		c := genFenceCase(r)
		reasons := c.expect()
		key := "allowed"
		if len(reasons) > 0 {
			key = reasons[0]
		}
		tally[c.cmd+" "+key]++
		t.Run(fmt.Sprint(i), func(t *testing.T) { checkFenceCase(t, c) })
		if t.Failed() {
			return
		}
	}
	t.Logf("%v", tally)
	for _, k := range []string{"update allowed", "update fence_field", "update not_locked", "delete allowed", "findAndModify allowed",
		"findAndModify fence_field", "bulkWrite fence_unsupported"} {
		if tally[k] < 10 {
			t.Errorf("only %d cases of %s", tally[k], k)
		}
	}
}
