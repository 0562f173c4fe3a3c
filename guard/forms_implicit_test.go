package guard_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard"
	"github.com/lockgate/lockgate/guard/guardtest"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// The forms of writes under a rule with unlockedWriters: refuseIfLocked,
// decided by a whole guard (over the in-memory lock store and resolver)
// and held to a model of docs/ENFORCEMENT.md, "Writers that hold no
// lock": a write whose session holds every lock it needs is a holder's
// (its inserts of _ids another session locked refused); one whose
// session holds some of them but not all is refused; one whose session
// holds none of them, or that carries no session, takes implicit locks
// on every document it can touch and every _id it inserts, and is
// refused if any of them is locked (by anyone: its session included,
// for an _id it only inserts), else allowed, its implicit locks gone
// once it is answered. guard/enforce's part (no no_session refusal
// under such a rule, the lock check's Defer, the inserts handed over)
// and the guard's (implicit.go) are decided together here; the forms
// of guard/enforce's TestAllowEveryForm without implicit locks are
// not repeated.

type implicitStmt struct {
	kind   string // update, delete, insert
	filter string // id, in, match
	ids    []int  // the _ids id and in name; the inserted _id
	match  int
	upsert bool
	ns     int // bulkWrite: 0 shop.orders, 1 shop.items (its nsInfo index)
}

// implicitColls are the enforced collections, by implicitStmt.ns.
var implicitColls = [...]string{"orders", "items"}

// lockKey names _id i of collection ns in implicitCase.locks: the _id
// itself in shop.orders, 10 + _id in shop.items.
func lockKey(ns, i int) int { return ns*10 + i }

// keys are the lock keys of ids in the statement's collection.
func (s implicitStmt) keys(ids []int) []int {
	out := make([]int, len(ids))
	for j, i := range ids {
		out[j] = lockKey(s.ns, i)
	}
	return out
}

type implicitCase struct {
	cmd         string // update, delete, findAndModify, insert, bulkWrite
	sessionless bool
	// wait: unlockedWriters: wait, with unlockedWaitMS 1 (nothing is
	// released meanwhile, so a locked document is waited for in vain).
	wait  bool
	stmts []implicitStmt
	locks map[int]int // lockKey -> 0 free, 1 the caller's session, 2 another's
	// twoNS: a bulkWrite whose nsInfo names shop.items after
	// shop.orders, its statements in either.
	twoNS bool
}

func (c implicitCase) String() string {
	return fmt.Sprintf("%s sessionless=%v wait=%v twoNS=%v locks=%v stmts=%+v", c.cmd, c.sessionless, c.wait, c.twoNS, c.locks, c.stmts)
}

// targets are the documents the statement may touch.
func (s implicitStmt) targets() []int {
	switch s.filter {
	case "match":
		var out []int
		for i := 1; i <= 6; i++ {
			if i%3 == s.match {
				out = append(out, i)
			}
		}
		return out
	}
	return s.ids
}

func (s implicitStmt) filterDoc() bson.D {
	switch s.filter {
	case "id":
		return bson.D{{Key: "_id", Value: s.ids[0]}}
	case "in":
		var in bson.A
		for _, i := range s.ids {
			in = append(in, i)
		}
		return bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: in}}}}
	}
	return bson.D{{Key: "k", Value: s.match}}
}

var implicitSet = bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 1}}}}

func (c implicitCase) body() bson.D {
	var b bson.D
	switch c.cmd {
	case "update":
		var us bson.A
		for _, s := range c.stmts {
			us = append(us, bson.D{{Key: "q", Value: s.filterDoc()}, {Key: "u", Value: implicitSet}, {Key: "multi", Value: true}, {Key: "upsert", Value: s.upsert}})
		}
		b = bson.D{{Key: "update", Value: "orders"}, {Key: "updates", Value: us}, {Key: "$db", Value: "shop"}}
	case "delete":
		var ds bson.A
		for _, s := range c.stmts {
			ds = append(ds, bson.D{{Key: "q", Value: s.filterDoc()}, {Key: "limit", Value: 0}})
		}
		b = bson.D{{Key: "delete", Value: "orders"}, {Key: "deletes", Value: ds}, {Key: "$db", Value: "shop"}}
	case "findAndModify":
		s := c.stmts[0]
		b = bson.D{{Key: "findAndModify", Value: "orders"}, {Key: "query", Value: s.filterDoc()}}
		if s.kind == "delete" {
			b = append(b, bson.E{Key: "remove", Value: true})
		} else {
			b = append(b, bson.E{Key: "update", Value: implicitSet}, bson.E{Key: "upsert", Value: s.upsert})
		}
		b = append(b, bson.E{Key: "$db", Value: "shop"})
	case "insert":
		var docs bson.A
		for _, s := range c.stmts {
			docs = append(docs, bson.D{{Key: "_id", Value: s.ids[0]}})
		}
		b = bson.D{{Key: "insert", Value: "orders"}, {Key: "documents", Value: docs}, {Key: "$db", Value: "shop"}}
	default:
		var ops bson.A
		for _, s := range c.stmts {
			switch s.kind {
			case "insert":
				ops = append(ops, bson.D{{Key: "insert", Value: s.ns}, {Key: "document", Value: bson.D{{Key: "_id", Value: s.ids[0]}}}})
			case "delete":
				ops = append(ops, bson.D{{Key: "delete", Value: s.ns}, {Key: "filter", Value: s.filterDoc()}, {Key: "multi", Value: true}})
			default:
				ops = append(ops, bson.D{{Key: "update", Value: s.ns}, {Key: "filter", Value: s.filterDoc()}, {Key: "updateMods", Value: implicitSet},
					{Key: "multi", Value: true}, {Key: "upsert", Value: s.upsert}})
			}
		}
		nsInfo := bson.A{bson.D{{Key: "ns", Value: "shop.orders"}}}
		if c.twoNS {
			nsInfo = append(nsInfo, bson.D{{Key: "ns", Value: "shop.items"}})
		}
		b = bson.D{{Key: "bulkWrite", Value: 1}, {Key: "ops", Value: ops}, {Key: "nsInfo", Value: nsInfo}, {Key: "$db", Value: "admin"}}
	}
	if !c.sessionless {
		b = append(b, bson.E{Key: "lsid", Value: implicitSession(0xa)})
	}
	return b
}

func implicitSession(b byte) bson.D {
	id := make([]byte, 16)
	id[0] = b
	return bson.D{{Key: "id", Value: primitive.Binary{Subtype: 4, Data: id}}}
}

// expect is the model: whether the write is allowed, the reasons it may
// be refused with, and, allowed, whether it ran under implicit locks.
func (c implicitCase) expect() (allowed bool, reasons []string, implicit bool) {
	var need, inserted []int
	for _, s := range c.stmts {
		if s.kind == "insert" {
			inserted = append(inserted, lockKey(s.ns, s.ids[0]))
		} else {
			need = append(need, s.keys(s.targets())...)
		}
	}
	held := func(i int) bool { return !c.sessionless && c.locks[i] == 1 }
	nHeld := 0
	for _, i := range need {
		if held(i) {
			nHeld++
		}
	}
	switch {
	case len(need) > 0 && nHeld == len(need):
		// A holder's write: its inserts are checked as any.
		for _, i := range inserted {
			if c.locks[i] == 2 {
				return false, []string{"insert_locked"}, false
			}
		}
		return true, nil, false
	case nHeld > 0:
		// Explicit and implicit locks never mix in one write.
		return false, []string{"not_locked", "held_by_other"}, false
	}
	own, other := false, false
	for _, i := range append(need, inserted...) {
		own = own || (!c.sessionless && c.locks[i] == 1)
		other = other || c.locks[i] == 2 || (c.sessionless && c.locks[i] == 1)
	}
	switch {
	case len(need) == 0 && own && !other:
		// Only inserts, of _ids the session holds or nobody does: the
		// holder's lock-then-insert (TestImplicitRuleHolderInsertsItsLockedID).
		return true, nil, false
	case c.wait && other && !own:
		// It waited for another session's lock in vain.
		return false, []string{"timeout"}, false
	case other && !own:
		return false, []string{"held_by_other"}, false
	case other || own:
		// The session's own lock on an _id it inserts makes it a lock
		// holder, answered as today (its other writes refused, another's
		// locked _id not inserted), unless another's lock was met first.
		return false, []string{"held_by_other", "not_locked", "insert_locked", "timeout"}, false
	}
	return true, nil, true
}

// implicitGuard is a guard enforcing shop.orders and shop.items with
// unlockedWriters: refuseIfLocked over the fixture {_id: i, k: i % 3}, i
// in 1..6, in each.
func implicitGuard(t *testing.T, wait bool) (*guard.Guard, *memstore.Store) {
	t.Helper()
	var rules []config.NamespaceRule
	res := guardtest.NewResolver()
	for _, coll := range implicitColls {
		rule := config.NamespaceRule{Match: "shop." + coll, Mode: config.ModeEnforce, UnlockedWriters: config.UnlockedRefuseIfLocked}
		if wait {
			rule.UnlockedWriters, rule.UnlockedWaitMS = config.UnlockedWait, 1
		}
		rules = append(rules, rule)
		for i := 1; i <= 6; i++ {
			if err := res.Insert("shop."+coll, bson.D{{Key: "_id", Value: i}, {Key: "k", Value: i % 3}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	pol, err := policy.Compile(config.Policy{Default: config.ModeOff, MaxCandidates: 3, Namespaces: rules})
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New(memstore.Config{DefaultLease: 30 * time.Second, MaxLease: time.Minute})
	g := guard.New(guard.Options{Store: store, Resolver: res, Reserved: guard.ReservedFor("lockgate", "locks"),
		OwnerSecret: []byte("forms-implicit-owner-secret-0123"), Logger: zap.NewNop(), OrderTimeout: time.Second})
	g.SetPolicy(pol)
	return g, store
}

// implicitIntercept decides body as the proxy would on connection conn;
// a write let through is answered ok, so that its flight, and its
// implicit locks, end.
func implicitIntercept(t *testing.T, g *guard.Guard, conn uint64, body bson.D) proxy.Decision {
	t.Helper()
	raw, err := bson.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := wire.Parse(wire.AppendMsg(nil, 7, 0, 0, raw), wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := wire.CommandOf(msg)
	if err != nil {
		t.Fatal(err)
	}
	d := g.Intercept(context.Background(), &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: conn, Addr: fmt.Sprintf("10.0.0.%d:5000", conn)}})
	if d.OnReply != nil {
		reply := bsoncore.Document(nil)
		if d.Action == proxy.Forward || d.Action == proxy.Rewrite {
			reply, _ = bson.Marshal(bson.D{{Key: "ok", Value: 1}, {Key: "n", Value: 1}})
		}
		d.OnReply.Reply(context.Background(), reply)
	}
	return d
}

func replyOK(d proxy.Decision) bool { return ok(d.Reply) }

// acquireImplicit takes the locks on ids of shop.orders for session s
// through g.
func acquireImplicit(t *testing.T, g *guard.Guard, conn uint64, s byte, ids []int) proxy.Decision {
	t.Helper()
	return acquireIn(t, g, conn, s, "orders", ids)
}

// acquireIn takes the locks on ids of shop.coll for session s through g.
func acquireIn(t *testing.T, g *guard.Guard, conn uint64, s byte, coll string, ids []int) proxy.Decision {
	t.Helper()
	var a bson.A
	for _, i := range ids {
		a = append(a, i)
	}
	return implicitIntercept(t, g, conn, bson.D{{Key: "acquireLock", Value: coll}, {Key: "ids", Value: a}, {Key: "$db", Value: "shop"},
		{Key: "lsid", Value: implicitSession(s)}})
}

func checkImplicitCase(t *testing.T, c implicitCase) {
	t.Helper()
	g, _ := implicitGuard(t, c.wait)
	for k, st := range c.locks {
		if st == 0 {
			continue
		}
		if d := acquireIn(t, g, 1, map[int]byte{1: 0xa, 2: 0xb}[st], implicitColls[k/10], []int{k % 10}); !replyOK(d) {
			t.Fatalf("acquireLock %d: %s", k, d.Reply)
		}
	}
	allowed, reasons, implicit := c.expect()
	d := implicitIntercept(t, g, 2, c.body())
	if !allowed {
		reason, _ := d.Reply.Lookup("lockgate", "reason").StringValueOK()
		if d.Action != proxy.Reply || replyOK(d) || !slices.Contains(reasons, reason) {
			t.Fatalf("%s\ndecision %v %s; want refused with one of %v", c, d.Action, d.Reply, reasons)
		}
		return
	}
	if d.Action != proxy.Forward && d.Action != proxy.Rewrite {
		t.Fatalf("%s\ndecision %v %s; want allowed (implicit locks: %v)", c, d.Action, d.Reply, implicit)
	}
	if !implicit {
		return
	}
	// Its implicit locks lasted one write: every document it touched,
	// and every _id it inserted, in each collection, can be locked again
	// at once.
	for ns, coll := range implicitColls {
		var all []int
		for _, s := range c.stmts {
			if s.ns == ns {
				all = append(all, s.targets()...)
			}
		}
		if len(all) == 0 {
			continue
		}
		slices.Sort(all)
		if a := acquireIn(t, g, 3, 0xc, coll, slices.Compact(all)); !replyOK(a) {
			t.Fatalf("%s\nafter the write was answered, its documents in %s cannot be locked: %s", c, coll, a.Reply)
		}
	}
}

// TestImplicitRuleHolderInsertsItsLockedID: under unlockedWriters
// (refuseIfLocked or wait), a session that holds the lock on _id 3 and
// inserts {_id: 3}, the lock-then-insert the lock is for, is allowed, as
// without unlockedWriters. It was refused not_locked ("this session does
// not hold the lock on 1 document its filter matches"): the insert's _id
// was taken as an implicit lock, which met the session's own lock.
func TestImplicitRuleHolderInsertsItsLockedID(t *testing.T) {
	for _, wait := range []bool{false, true} {
		for _, cmd := range []string{"insert", "bulkWrite"} {
			c := implicitCase{cmd: cmd, wait: wait, locks: map[int]int{3: 1}, stmts: []implicitStmt{{kind: "insert", ids: []int{3}}}}
			t.Run(fmt.Sprintf("%s wait=%v", cmd, wait), func(t *testing.T) { checkImplicitCase(t, c) })
		}
	}
}

func genImplicitCase(r *rand.Rand) implicitCase {
	c := implicitCase{cmd: []string{"update", "delete", "findAndModify", "insert", "bulkWrite"}[r.IntN(5)], sessionless: r.IntN(4) == 0,
		wait: r.IntN(3) == 0, locks: map[int]int{}}
	for i := 1; i <= 6; i++ {
		c.locks[i] = []int{0, 0, 0, 1, 1, 2}[r.IntN(6)]
	}
	n := 1 + r.IntN(2)
	if c.cmd == "findAndModify" {
		n = 1
	}
	id := func() int { return 1 + r.IntN(6) }
	for range n {
		s := implicitStmt{filter: []string{"id", "in", "match"}[r.IntN(3)], match: r.IntN(3)}
		switch c.cmd {
		case "insert":
			s.kind = "insert"
		case "delete":
			s.kind = "delete"
		case "update":
			s.kind = "update"
		default:
			s.kind = []string{"update", "delete", "insert"}[r.IntN(3)]
			if c.cmd == "findAndModify" && s.kind == "insert" {
				s.kind = "update"
			}
		}
		s.pickIDs(r, id)
		c.stmts = append(c.stmts, s)
	}
	return c
}

// pickIDs gives s the _ids its kind and filter name, drawn by id: one
// for an insert or an _id filter (which may upsert), one or two for $in.
func (s *implicitStmt) pickIDs(r *rand.Rand, id func() int) {
	switch {
	case s.kind == "insert":
		s.filter, s.ids = "", []int{id()}
	case s.filter == "id":
		s.ids = []int{id()}
		s.upsert = s.kind == "update" && r.IntN(3) == 0
	case s.filter == "in":
		s.ids = []int{id(), id()}
		slices.Sort(s.ids)
		s.ids = slices.Compact(s.ids)
	}
}

// formCases is how many of n cases a forms test draws: a fifth under the
// race detector, which decides several times slower and adds to these
// tests only the decisions' goroutines checked, which the first cases
// exercise as the last do; all n, and the check that the draw covers
// every outcome (full), without it, in go test ./..., where this package
// must stay (scripts/test.sh).
func formCases(n int) (cases int, full bool) {
	if raceEnabled {
		return n / 5, false
	}
	return n, true
}

// TestImplicitLockForms: writes of every form, from a session holding
// all, some or none of their locks, or from no session, under
// unlockedWriters: refuseIfLocked or wait, decided as the model says.
// Fixed seed.
func TestImplicitLockForms(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 2026))
	tally := map[string]int{}
	cases, full := formCases(1500)
	for i := range cases {
		c := genImplicitCase(r)
		allowed, _, implicit := c.expect()
		tally[fmt.Sprintf("allowed=%v implicit=%v sessionless=%v", allowed, implicit, c.sessionless)]++
		if c.wait {
			tally[fmt.Sprintf("wait allowed=%v", allowed)]++
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) { checkImplicitCase(t, c) })
		if t.Failed() {
			return
		}
	}
	t.Logf("%v", tally)
	if !full {
		return
	}
	for k, n := range tally {
		if n < 10 && !strings.Contains(k, "allowed=true implicit=false sessionless=true") {
			t.Errorf("only %d cases of %s", n, k)
		}
	}
}

// genTwoNamespaceCase is a bulkWrite whose statements (two or three)
// are in shop.orders and shop.items, with locks in both.
func genTwoNamespaceCase(r *rand.Rand) implicitCase {
	c := implicitCase{cmd: "bulkWrite", twoNS: true, sessionless: r.IntN(4) == 0, wait: r.IntN(3) == 0, locks: map[int]int{}}
	for ns := range implicitColls {
		for i := 1; i <= 6; i++ {
			c.locks[lockKey(ns, i)] = []int{0, 0, 0, 1, 1, 2}[r.IntN(6)]
		}
	}
	id := func() int { return 1 + r.IntN(6) }
	n := 2 + r.IntN(2)
	for k := range n {
		s := implicitStmt{kind: []string{"update", "delete", "insert"}[r.IntN(3)], filter: []string{"id", "in", "match"}[r.IntN(3)], match: r.IntN(3), ns: r.IntN(2)}
		if k == 1 && s.ns == c.stmts[0].ns {
			s.ns = 1 - s.ns // both collections, always
		}
		s.pickIDs(r, id)
		c.stmts = append(c.stmts, s)
	}
	return c
}

// TestImplicitLocksAcrossNamespaces: a bulkWrite over shop.orders and
// shop.items, both under unlockedWriters, from a session holding all,
// some or none of the locks it needs across both, or from no session:
// its implicit locks are taken in both collections (an _id locked by
// another session in either refuses it all), its held locks are counted
// across both (holding every one in one collection and none in the
// other is holding some), and, allowed, none outlives it in either.
// Fixed seed, apart from TestImplicitLockForms'.
func TestImplicitLocksAcrossNamespaces(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 2026))
	tally := map[string]int{}
	cases, full := formCases(600)
	for i := range cases {
		c := genTwoNamespaceCase(r)
		allowed, reasons, implicit := c.expect()
		key := fmt.Sprintf("allowed=%v implicit=%v", allowed, implicit)
		if !allowed {
			key += " " + reasons[0]
		}
		tally[key]++
		t.Run(fmt.Sprint(i), func(t *testing.T) { checkImplicitCase(t, c) })
		if t.Failed() {
			return
		}
	}
	t.Logf("%v", tally)
	if !full {
		return
	}
	for _, k := range []string{"allowed=true implicit=true", "allowed=true implicit=false", "allowed=false implicit=false held_by_other",
		"allowed=false implicit=false not_locked", "allowed=false implicit=false timeout"} {
		if tally[k] < 10 {
			t.Errorf("only %d cases of %s", tally[k], k)
		}
	}
}
