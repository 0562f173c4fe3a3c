package reliability

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/wire"
)

// TestNamespaceSpellings is a model-based test of how a writer that holds
// no lock may spell a namespace: every form the generator makes names a
// protected collection (enforce, nothing else) in some other way than its
// configured text (case, spaces, NUL, a Unicode look-alike or the other
// normal form, a non-string collection, $db twice or in a document
// sequence, the legacy OP_QUERY, a full namespace in renameCollection,
// bulkWrite's nsInfo, applyOps, an aggregation's $out/$merge), and is sent
// twice: straight to FerretDB on a control database laid out like the
// protected one (what the upstream does with the spelling), and through
// lockgate on the protected database. After every form the protected
// collections are read directly and must equal the model, which only a
// lock holder's writes (interleaved, from a seeded PRNG) change.
//
// A form the control shows to write the control's protected data must be
// refused by lockgate itself. A form the upstream refuses may be forwarded
// (the leftover of docs/SECURITY.md's namespace-spelling row): the test
// proves that it wrote nothing.
//
// LOCKGATE_NS_SPELLING_SEED picks another seed (the holder's steps and the
// order of the forms).
func TestNamespaceSpellings(t *testing.T) {
	t.Parallel()
	seed := uint64(1)
	if s := os.Getenv("LOCKGATE_NS_SPELLING_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("LOCKGATE_NS_SPELLING_SEED=%q: %v", s, err)
		}
		seed = n
	}
	m := newSpellingModel(t, seed)
	forms := spellingForms()
	m.rng.Shuffle(len(forms), func(i, j int) { forms[i], forms[j] = forms[j], forms[i] })
	verdicts := map[string]int{}
	for i, f := range forms {
		if m.rng.IntN(8) == 0 {
			m.holderWrite(i)
		}
		verdicts[m.try(f, i)]++
	}
	keys := make([]string, 0, len(verdicts))
	for k := range verdicts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("%4d  %s", verdicts[k], k)
	}
	if verdicts["control written, lockgate refused"] == 0 || verdicts["control written, lockgate closed the connection (malformed)"] == 0 {
		t.Error("no form wrote the control's protected data: the generator lost its positive cases")
	}
}

// spellingColls are the protected collections: plain ASCII, and one
// with a precomposed é (NFC), whose decomposed spelling is another name.
var spellingColls = [...]string{"orders", "ord\u00e9rs"}

const spellingIDs = 3 // _id 1..3 in each protected collection

type spellingModel struct {
	t       *testing.T
	ctx     context.Context
	rng     *mrand.Rand
	db, ctl string // the protected database and the control one
	direct  *mongo.Client
	proxy   *spellConn // lockgate, a session that holds nothing
	holder  *spellConn // lockgate, the lock holder
	up      *spellConn // FerretDB itself
	proxyA  string
	upA     string
	// the model: v of each protected document, per collection
	want [len(spellingColls)]map[int32]int32
}

func newSpellingModel(t *testing.T, seed uint64) *spellingModel {
	// 626 forms, each sent twice and checked: 240 s was not enough in a
	// CI run at load 20; the package's own limit is 20 minutes.
	ctx := testCtx(t, 12*time.Minute)
	m := &spellingModel{t: t, ctx: ctx, rng: mrand.New(mrand.NewPCG(seed, 73)), db: uniq("nsspell"), ctl: uniq("nsctl")}
	cfg := gatewayConfig(upstream.URI(), uniq("locks"), "")
	for _, c := range spellingColls {
		cfg.Policy.Namespaces = append(cfg.Policy.Namespaces, config.NamespaceRule{Match: m.db + "." + c, Mode: config.ModeEnforce})
	}
	g := startGateway(t, cfg)
	m.direct = connect(t, upstream.URI(), "direct")
	m.proxyA, m.upA = strings.TrimPrefix(g.URI, "mongodb://"), strings.TrimPrefix(upstream.URI(), "mongodb://")
	m.proxyA, m.upA = hostOf(m.proxyA), hostOf(m.upA)
	m.proxy, m.holder, m.up = newSpellConn(t, m.proxyA), newSpellConn(t, m.proxyA), newSpellConn(t, m.upA)
	for i := range spellingColls {
		m.want[i] = map[int32]int32{}
		for id := int32(1); id <= spellingIDs; id++ {
			m.want[i][id] = 0
		}
	}
	m.reset(m.db)
	m.reset(m.ctl)
	return m
}

// hostOf is the host:port of a mongodb:// URI's remainder.
func hostOf(s string) string {
	if i := strings.IndexAny(s, "/?"); i >= 0 {
		return s[:i]
	}
	return s
}

// reset lays db out as the protected database is at the start: each
// protected collection with _id 1..3 at v 0, and a decoy collection that
// renames and $out read from.
func (m *spellingModel) reset(db string) {
	m.t.Helper()
	d := m.direct.Database(db)
	if err := d.Drop(m.ctx); err != nil {
		m.t.Fatalf("dropping %s: %v", db, err)
	}
	for _, c := range append(spellingColls[:], "decoy") {
		docs := []any{}
		for id := int32(1); id <= spellingIDs; id++ {
			docs = append(docs, bson.D{{"_id", id}, {"v", int32(0)}})
		}
		if _, err := d.Collection(c).InsertMany(m.ctx, docs); err != nil {
			m.t.Fatalf("seeding %s.%s: %v", db, c, err)
		}
	}
}

// snapshot reads the protected collections of db directly.
func (m *spellingModel) snapshot(db string) [len(spellingColls)]map[int32]int32 {
	m.t.Helper()
	var out [len(spellingColls)]map[int32]int32
	for i, c := range spellingColls {
		out[i] = map[int32]int32{}
		cur, err := m.direct.Database(db).Collection(c).Find(m.ctx, bson.D{})
		if err != nil {
			m.t.Fatalf("reading %s.%s: %v", db, c, err)
		}
		var docs []struct {
			ID any   `bson:"_id"`
			V  int32 `bson:"v"`
		}
		if err := cur.All(m.ctx, &docs); err != nil {
			m.t.Fatalf("reading %s.%s: %v", db, c, err)
		}
		for _, d := range docs {
			id, ok := d.ID.(int32)
			if !ok {
				id = -1 // a document the seed did not make
			}
			out[i][id] = d.V
		}
	}
	return out
}

func sameDocs(a, b [len(spellingColls)]map[int32]int32) bool {
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for k, v := range a[i] {
			if w, ok := b[i][k]; !ok || w != v {
				return false
			}
		}
	}
	return true
}

func (m *spellingModel) fresh() [len(spellingColls)]map[int32]int32 {
	var out [len(spellingColls)]map[int32]int32
	for i := range out {
		out[i] = map[int32]int32{}
		for id := int32(1); id <= spellingIDs; id++ {
			out[i][id] = 0
		}
	}
	return out
}

// holderWrite is a lock holder's step: lock _id k of a protected
// collection, set its v through lockgate, release. The model follows.
func (m *spellingModel) holderWrite(step int) {
	m.t.Helper()
	ci := m.rng.IntN(len(spellingColls))
	c, id, v := spellingColls[ci], int32(1+m.rng.IntN(spellingIDs)), int32(1000+step)
	for _, cmd := range []bson.D{
		{{"acquireLock", c}, {"ids", bson.A{id}}, {"leaseMS", 30000}},
		{{"update", c}, {"updates", bson.A{bson.D{{"q", bson.D{{"_id", id}}}, {"u", bson.D{{"$set", bson.D{{"v", v}}}}}}}}},
		{{"releaseLock", c}, {"ids", bson.A{id}}},
	} {
		cmd = append(cmd, bson.E{"lsid", bson.D{{"id", bsonUUID(m.holder.lsid)}}}, bson.E{"$db", m.db})
		r := m.holder.send(m.t, wire.AppendMsg(nil, m.holder.next(), 0, 0, marshal(cmd)))
		if r.closed || r.code != 0 || !r.ok {
			m.t.Fatalf("holder step %d: %v: %+v", step, cmd[0], r)
		}
	}
	m.want[ci][id] = v
	if got := m.snapshot(m.db); !sameDocs(got, m.want) {
		m.t.Fatalf("after the holder's write of %s _id %d: %v, want %v", c, id, got, m.want)
	}
}

// holderLock is the lock holder's acquireLock or releaseLock of
// lockedInsertID in protected collection c.
func (m *spellingModel) holderLock(c, cmd string) {
	m.t.Helper()
	body := bson.D{{cmd, c}, {"ids", bson.A{lockedInsertID}}, {"lsid", bson.D{{"id", bsonUUID(m.holder.lsid)}}}, {"$db", m.db}}
	if cmd == "acquireLock" {
		body = slices.Insert(body, 2, bson.E{"leaseMS", int32(30000)})
	}
	if r := m.holder.send(m.t, wire.AppendMsg(nil, m.holder.next(), 0, 0, marshal(body))); r.closed || r.code != 0 || !r.ok {
		m.t.Fatalf("holder %s of _id %d in %s: %+v", cmd, lockedInsertID, c, r)
	}
}

// try sends f to the control through FerretDB and to the protected
// database through lockgate, checks the invariant, and names the verdict.
func (m *spellingModel) try(f spellingForm, step int) string {
	m.t.Helper()
	upR := m.up.send(m.t, f.build(m.ctl, m.up, int32(-1-step)))
	ctlWritten := !sameDocs(m.snapshot(m.ctl), m.fresh())
	if ctlWritten {
		m.reset(m.ctl)
	}
	if f.heldColl != "" {
		m.holderLock(f.heldColl, "acquireLock")
	}
	pxR := m.proxy.send(m.t, f.build(m.db, m.proxy, int32(-1-step)))
	if f.heldColl != "" {
		m.holderLock(f.heldColl, "releaseLock")
	}
	if got := m.snapshot(m.db); !sameDocs(got, m.want) {
		m.t.Errorf("%s: a session holding no lock changed the protected data: %v, want %v (lockgate answered %+v; FerretDB alone %+v)", f.name, got, m.want, pxR, upR)
		m.reset(m.db)
		m.want = m.fresh()
	}
	var v string
	switch {
	case ctlWritten && pxR.lockgate:
		v = "control written, lockgate refused"
	case ctlWritten && pxR.closed:
		v = "control written, lockgate closed the connection (malformed)"
	case ctlWritten:
		m.t.Errorf("%s: writes the protected data on FerretDB, but lockgate did not refuse it: %+v", f.name, pxR)
		v = "control written, lockgate forwarded"
	case f.folds && !pxR.lockgate:
		m.t.Errorf("%s: a case variant of the protected database, which a folding upstream writes as the protected one, was not refused by lockgate: %+v", f.name, pxR)
		v = "database case variant, lockgate forwarded"
	case f.folds:
		v = "database case variant, lockgate refused"
	case pxR.lockgate:
		v = "upstream writes nothing, lockgate refused"
	case pxR.closed:
		v = "connection closed (malformed)"
	default:
		v = "upstream writes nothing, forwarded"
	}
	m.t.Logf("%-70q %-42s upstream: %s; via lockgate: %s", f.name, v, upR, pxR)
	return v
}

// spellConn is one connection speaking raw wire messages, redialled when
// the other side closes it (lockgate closes a connection whose request it
// cannot read).
type spellConn struct {
	addr string
	c    net.Conn
	r    *bufio.Reader
	lsid []byte // a session of its own, subtype 4
	id   int32
}

func newSpellConn(t *testing.T, addr string) *spellConn {
	sc := &spellConn{addr: addr, lsid: make([]byte, 16)}
	rand.Read(sc.lsid)
	sc.lsid[6] = sc.lsid[6]&0x0f | 0x40
	sc.lsid[8] = sc.lsid[8]&0x3f | 0x80
	sc.dial(t)
	t.Cleanup(func() { sc.c.Close() })
	return sc
}

func (sc *spellConn) dial(t *testing.T) {
	t.Helper()
	c, err := net.DialTimeout("tcp", sc.addr, 10*time.Second)
	if err != nil {
		t.Fatalf("dialing %s: %v", sc.addr, err)
	}
	sc.c, sc.r = c, bufio.NewReader(c)
}

func (sc *spellConn) next() int32 { sc.id++; return sc.id }

// spellReply is what one request got.
type spellReply struct {
	closed   bool
	ok       bool // ok: 1 without writeErrors
	code     int32
	lockgate bool // the answer is lockgate's refusal (it has a lockgate field)
	msg      string
}

func (r spellReply) String() string {
	switch {
	case r.closed:
		return "closed"
	case r.ok:
		return "ok"
	}
	who := "upstream"
	if r.lockgate {
		who = "lockgate"
	}
	msg := r.msg
	if len(msg) > 60 {
		msg = msg[:60] + "..."
	}
	return fmt.Sprintf("%s %d %q", who, r.code, msg)
}

// send writes one request and reads its reply.
func (sc *spellConn) send(t *testing.T, req []byte) spellReply {
	t.Helper()
	sc.c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := sc.c.Write(req); err != nil {
		sc.c.Close()
		sc.dial(t)
		return spellReply{closed: true}
	}
	raw, err := wire.ReadMessage(sc.r, nil, wire.Limits{})
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("no reply from %s in a minute", sc.addr)
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !strings.Contains(err.Error(), "reset") {
			t.Logf("reading from %s: %v", sc.addr, err)
		}
		sc.c.Close()
		sc.dial(t)
		return spellReply{closed: true}
	}
	msg, err := wire.Parse(append([]byte(nil), raw.Bytes...), wire.Limits{})
	raw.Release()
	if err != nil {
		t.Fatalf("reply from %s: %v", sc.addr, err)
	}
	var body bson.Raw
	switch msg := msg.(type) {
	case *wire.OpMsg:
		body = bson.Raw(msg.Body)
	case *wire.OpReply:
		if len(msg.Documents) == 0 {
			t.Fatalf("an OP_REPLY without a document from %s", sc.addr)
		}
		body = bson.Raw(msg.Documents[0])
	default:
		t.Fatalf("reply in %v from %s", msg.Header().OpCode, sc.addr)
	}
	return readSpellReply(body)
}

func readSpellReply(body bson.Raw) spellReply {
	var r spellReply
	if v, err := body.LookupErr("ok"); err == nil {
		if f, ok := v.DoubleOK(); ok {
			r.ok = f == 1
		} else if n, ok := v.AsInt64OK(); ok {
			r.ok = n == 1
		}
	}
	errDoc := body
	if we, err := body.LookupErr("writeErrors"); err == nil {
		if vals, _ := we.Array().Values(); len(vals) > 0 {
			r.ok = false
			errDoc = vals[0].Document()
		}
	}
	if r.ok {
		return r
	}
	if v, err := errDoc.LookupErr("code"); err == nil {
		c, _ := v.AsInt64OK()
		r.code = int32(c)
	}
	for _, k := range []string{"errmsg", "$err"} {
		if v, err := errDoc.LookupErr(k); err == nil {
			r.msg, _ = v.StringValueOK()
		}
	}
	// Every refusal of lockgate's carries {lockgate: {reason, ...}}.
	_, err := errDoc.LookupErr("lockgate")
	r.lockgate = err == nil
	return r
}

// marshal is bson.Marshal of a value the test wrote, which cannot fail.
func marshal(v any) bsoncore.Document {
	b, err := bson.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// spellingForm is one request naming a protected collection in some way:
// build frames it for database db (the protected one or the control) on
// connection sc, with v the value it would write.
type spellingForm struct {
	name  string
	build func(db string, sc *spellConn, v int32) []byte
	// folds: the form names the protected collection in a case variant
	// of its database, which an upstream on a case-insensitive file
	// system (FerretDB with SQLite on macOS or Windows) opens as the
	// protected one; FerretDB here keeps them apart, so lockgate itself
	// must refuse it.
	folds bool
	// heldColl, when set, is a protected collection in which the lock
	// holder holds _id lockedInsertID while the form is sent through
	// lockgate (to create it: lock, then upsert).
	heldColl string
}

// lockedInsertID is the _id a lock holder holds, not yet created, while a
// form inserts it into a case variant of the protected database.
const lockedInsertID = int32(100)

// foldsDB reports whether a database spelling is an ASCII case variant.
func foldsDB(name string) bool { return name == "UPPER" || name == "Title" }

// collSpellings turn a protected collection's name into another spelling
// of it; dbSpellings do the same to the database.
var collSpellings = []struct {
	name string
	f    func(string) string
}{
	{"exact", func(s string) string { return s }},
	{"UPPER", strings.ToUpper},
	{"Title", func(s string) string { return strings.ToUpper(s[:1]) + s[1:] }},
	{"leading space", func(s string) string { return " " + s }},
	{"trailing space", func(s string) string { return s + " " }},
	{"trailing NUL", func(s string) string { return s + "\x00" }},
	{"NUL inside", func(s string) string { return s[:2] + "\x00" + s[2:] }},
	{"NFD", func(s string) string { return strings.ReplaceAll(s, "\u00e9", "e\u0301") }},
	{"full-width first letter", func(s string) string { return string(rune(0xFF41+int(s[0]-'a'))) + s[1:] }},
	{"Cyrillic o", func(s string) string { return strings.Replace(s, "o", "\u043e", 1) }},
	{"trailing dot", func(s string) string { return s + "." }},
	{"leading dot", func(s string) string { return "." + s }},
	{"system. prefix", func(s string) string { return "system." + s }},
	{"system.buckets. prefix", func(s string) string { return "system.buckets." + s }},
	{"empty", func(string) string { return "" }},
}

var dbSpellings = []struct {
	name string
	f    func(string) string
}{
	{"exact", func(s string) string { return s }},
	{"UPPER", strings.ToUpper},
	{"Title", func(s string) string { return strings.ToUpper(s[:1]) + s[1:] }},
	{"leading space", func(s string) string { return " " + s }},
	{"trailing space", func(s string) string { return s + " " }},
	{"trailing NUL", func(s string) string { return s + "\x00" }},
	{"NUL inside", func(s string) string { return s[:2] + "\x00" + s[2:] }},
	{"full-width first letter", func(s string) string { return string(rune(0xFF41+int(s[0]-'a'))) + s[1:] }},
	{"trailing dot", func(s string) string { return s + "." }},
	{"with .coll", func(s string) string { return s + ".orders" }},
}

// nonStringColls are first values that are no collection name.
var nonStringColls = []struct {
	name string
	v    func(coll string) any
}{
	{"UUID", func(string) any { return bson.Raw(nil) }}, // replaced in build
	{"int 1", func(string) any { return int32(1) }},
	{"array of the name", func(c string) any { return bson.A{c} }},
	{"document", func(c string) any { return bson.D{{"name", c}} }},
	{"null", func(string) any { return nil }},
}

// writeCmd is a write of _id 1 (or 2, deleted) of coll in one of the
// commands that take a collection as their first value.
type writeCmd struct {
	name string
	body func(coll any, v int32) bson.D
}

var writeCmds = []writeCmd{
	{"update", func(c any, v int32) bson.D {
		return bson.D{{"update", c}, {"updates", bson.A{bson.D{{"q", bson.D{{"_id", int32(1)}}}, {"u", bson.D{{"$set", bson.D{{"v", v}}}}}}}}}
	}},
	{"delete", func(c any, v int32) bson.D {
		return bson.D{{"delete", c}, {"deletes", bson.A{bson.D{{"q", bson.D{{"_id", int32(2)}}}, {"limit", int32(1)}}}}}
	}},
	{"findAndModify", func(c any, v int32) bson.D {
		return bson.D{{"findAndModify", c}, {"query", bson.D{{"_id", int32(1)}}}, {"update", bson.D{{"$set", bson.D{{"v", v}}}}}}
	}},
	{"findandmodify", func(c any, v int32) bson.D {
		return bson.D{{"findandmodify", c}, {"query", bson.D{{"_id", int32(3)}}}, {"remove", true}}
	}},
	{"drop", func(c any, v int32) bson.D { return bson.D{{"drop", c}} }},
}

// msgOn frames body on db for sc's session; extra elements go before $db.
func msgOn(sc *spellConn, db string, body bson.D, seqs ...wire.Sequence) []byte {
	body = append(body, bson.E{"lsid", bson.D{{"id", bsonUUID(sc.lsid)}}}, bson.E{"$db", db})
	return wire.AppendMsg(nil, sc.next(), 0, 0, marshal(body), seqs...)
}

func bsonUUID(b []byte) any {
	return bson.RawValue{Type: bson.TypeBinary, Value: binValue(4, b)}
}

func binValue(sub byte, b []byte) []byte {
	out := binary.LittleEndian.AppendUint32(nil, uint32(len(b)))
	out = append(out, sub)
	return append(out, b...)
}

// spellingForms is the generator: every command with every spelling of
// the collection on the exact database and every spelling of the
// database with the exact collection, for each protected collection; the
// non-string collections; and the forms that name the namespace elsewhere
// than in $db and the first value.
func spellingForms() []spellingForm {
	var forms []spellingForm
	for _, coll := range spellingColls {
		for _, wc := range writeCmds {
			for _, cs := range collSpellings {
				if cs.name != "exact" && cs.f(coll) == coll {
					continue // NFD of a name without é
				}
				forms = append(forms, spellingForm{
					name: fmt.Sprintf("%s: coll %s (%q)", wc.name, cs.name, cs.f(coll)),
					build: func(db string, sc *spellConn, v int32) []byte {
						return msgOn(sc, db, wc.body(cs.f(coll), v))
					},
				})
			}
			for _, ds := range dbSpellings[1:] {
				forms = append(forms, spellingForm{
					name: fmt.Sprintf("%s %q: $db %s", wc.name, coll, ds.name),
					build: func(db string, sc *spellConn, v int32) []byte {
						return msgOn(sc, ds.f(db), wc.body(coll, v))
					},
					folds: foldsDB(ds.name),
				})
			}
			if wc.name == "update" {
				for _, ds := range dbSpellings {
					if !foldsDB(ds.name) {
						continue
					}
					// An _id the holder locked to create it: inserted
					// into the variant, a folding upstream creates the
					// locked document (it was allowed, the insert check
					// looking for locks under the variant's name).
					forms = append(forms, spellingForm{
						name: fmt.Sprintf("insert of an _id locked in %q: $db %s", coll, ds.name),
						build: func(db string, sc *spellConn, v int32) []byte {
							return msgOn(sc, ds.f(db), bson.D{{"insert", coll}, {"documents", bson.A{bson.D{{"_id", lockedInsertID}, {"v", v}}}}})
						},
						folds: true, heldColl: coll,
					})
					// The lock that would make the variant's writes
					// pass: none is granted there.
					forms = append(forms, spellingForm{
						name: fmt.Sprintf("acquireLock %q: $db %s", coll, ds.name),
						build: func(db string, sc *spellConn, v int32) []byte {
							return msgOn(sc, ds.f(db), bson.D{{"acquireLock", coll}, {"ids", bson.A{int32(1)}}})
						},
						folds: true,
					})
				}
			}
			for _, ns := range nonStringColls {
				forms = append(forms, spellingForm{
					name: fmt.Sprintf("%s %q: collection as %s", wc.name, coll, ns.name),
					build: func(db string, sc *spellConn, v int32) []byte {
						c := ns.v(coll)
						if ns.name == "UUID" {
							c = bsonUUID([]byte("0123456789abcdef"))
						}
						return msgOn(sc, db, wc.body(c, v))
					},
				})
			}
		}
		// Full namespaces: renameCollection out of and into the
		// protected collection, bulkWrite's nsInfo, applyOps.
		for _, cs := range collSpellings {
			if cs.name != "exact" && cs.f(coll) == coll {
				continue
			}
			for _, ds := range dbSpellings {
				if cs.name != "exact" && ds.name != "exact" {
					continue
				}
				full := func(db string) string { return ds.f(db) + "." + cs.f(coll) }
				forms = append(forms,
					spellingForm{
						name: fmt.Sprintf("renameCollection from %q (coll %s, db %s)", coll, cs.name, ds.name),
						build: func(db string, sc *spellConn, v int32) []byte {
							return msgOn(sc, "admin", bson.D{{"renameCollection", full(db)}, {"to", db + ".moved" + strconv.Itoa(int(-v))}})
						},
						folds: foldsDB(ds.name) && cs.name == "exact",
					},
					spellingForm{
						name: fmt.Sprintf("renameCollection decoy onto %q with dropTarget (coll %s, db %s)", coll, cs.name, ds.name),
						build: func(db string, sc *spellConn, v int32) []byte {
							return msgOn(sc, "admin", bson.D{{"renameCollection", db + ".decoy"}, {"to", full(db)}, {"dropTarget", true}})
						},
						folds: foldsDB(ds.name) && cs.name == "exact",
					},
					spellingForm{
						name: fmt.Sprintf("bulkWrite nsInfo %q (coll %s, db %s)", coll, cs.name, ds.name),
						build: func(db string, sc *spellConn, v int32) []byte {
							return msgOn(sc, "admin", bson.D{{"bulkWrite", int32(1)},
								{"ops", bson.A{bson.D{{"update", int32(0)}, {"filter", bson.D{{"_id", int32(1)}}}, {"updateMods", bson.D{{"$set", bson.D{{"v", v}}}}}}}},
								{"nsInfo", bson.A{bson.D{{"ns", full(db)}}}}})
						},
						folds: foldsDB(ds.name) && cs.name == "exact",
					},
					spellingForm{
						name: fmt.Sprintf("applyOps on %q (coll %s, db %s)", coll, cs.name, ds.name),
						build: func(db string, sc *spellConn, v int32) []byte {
							return msgOn(sc, "admin", bson.D{{"applyOps", bson.A{bson.D{{"op", "u"}, {"ns", full(db)}, {"o", bson.D{{"$set", bson.D{{"v", v}}}}}, {"o2", bson.D{{"_id", int32(1)}}}}}}})
						},
						folds: foldsDB(ds.name) && cs.name == "exact",
					},
					spellingForm{
						name: fmt.Sprintf("aggregate $out {db, coll} into %q (coll %s, db %s)", coll, cs.name, ds.name),
						build: func(db string, sc *spellConn, v int32) []byte {
							return msgOn(sc, db, bson.D{{"aggregate", "decoy"}, {"pipeline", bson.A{bson.D{{"$out", bson.D{{"db", ds.f(db)}, {"coll", cs.f(coll)}}}}}}, {"cursor", bson.D{}}})
						},
						folds: foldsDB(ds.name) && cs.name == "exact",
					},
					spellingForm{
						name: fmt.Sprintf("aggregate $merge into %q (coll %s, db %s)", coll, cs.name, ds.name),
						build: func(db string, sc *spellConn, v int32) []byte {
							return msgOn(sc, db, bson.D{{"aggregate", "decoy"}, {"pipeline", bson.A{bson.D{{"$set", bson.D{{"v", v}}}}, bson.D{{"$merge", bson.D{{"into", bson.D{{"db", ds.f(db)}, {"coll", cs.f(coll)}}}}}}}}, {"cursor", bson.D{}}})
						},
						folds: foldsDB(ds.name) && cs.name == "exact",
					},
				)
			}
			forms = append(forms, spellingForm{
				name: fmt.Sprintf("aggregate $out %q into coll %s", coll, cs.name),
				build: func(db string, sc *spellConn, v int32) []byte {
					return msgOn(sc, db, bson.D{{"aggregate", "decoy"}, {"pipeline", bson.A{bson.D{{"$out", cs.f(coll)}}}}, {"cursor", bson.D{}}})
				},
			})
		}
		forms = append(forms, wireSpellingForms(coll)...)
	}
	return forms
}

// wireSpellingForms name the protected collection or its database where
// lockgate and the server could read different values: twice, in a
// document sequence, in OP_QUERY. decoy is a database or collection
// nothing protects.
func wireSpellingForms(coll string) []spellingForm {
	upd := func(v int32) bson.A {
		return bson.A{bson.D{{"q", bson.D{{"_id", int32(1)}}}, {"u", bson.D{{"$set", bson.D{{"v", v}}}}}}}
	}
	updDocs := func(v int32) []bsoncore.Document {
		return []bsoncore.Document{marshal(bson.D{{"q", bson.D{{"_id", int32(1)}}}, {"u", bson.D{{"$set", bson.D{{"v", v}}}}}})}
	}
	raw := func(sc *spellConn, elems ...func(*bsoncore.DocumentBuilder)) bsoncore.Document {
		b := bsoncore.NewDocumentBuilder()
		for _, e := range elems {
			e(b)
		}
		return b.Build()
	}
	str := func(k, v string) func(*bsoncore.DocumentBuilder) {
		return func(b *bsoncore.DocumentBuilder) { b.AppendString(k, v) }
	}
	arr := func(k string, a bson.A) func(*bsoncore.DocumentBuilder) {
		return func(b *bsoncore.DocumentBuilder) {
			_, data, err := bson.MarshalValue(a)
			if err != nil {
				panic(err)
			}
			b.AppendArray(k, data)
		}
	}
	lsid := func(sc *spellConn) func(*bsoncore.DocumentBuilder) {
		return func(b *bsoncore.DocumentBuilder) {
			b.AppendDocument("lsid", bsoncore.NewDocumentBuilder().AppendBinary("id", 4, sc.lsid).Build())
		}
	}
	msg := func(sc *spellConn, body bsoncore.Document, seqs ...wire.Sequence) []byte {
		return wire.AppendMsg(nil, sc.next(), 0, 0, body, seqs...)
	}
	return []spellingForm{
		{name: fmt.Sprintf("%q: $db twice, decoy first", coll), build: func(db string, sc *spellConn, v int32) []byte {
			return msg(sc, raw(sc, str("update", coll), arr("updates", upd(v)), lsid(sc), str("$db", db+"x"), str("$db", db)))
		}},
		{name: fmt.Sprintf("%q: $db twice, decoy last", coll), build: func(db string, sc *spellConn, v int32) []byte {
			return msg(sc, raw(sc, str("update", coll), arr("updates", upd(v)), lsid(sc), str("$db", db), str("$db", db+"x")))
		}},
		{name: fmt.Sprintf("%q: the command key twice, decoy first", coll), build: func(db string, sc *spellConn, v int32) []byte {
			return msg(sc, raw(sc, str("update", "decoy"), arr("updates", upd(v)), str("update", coll), lsid(sc), str("$db", db)))
		}},
		{name: fmt.Sprintf("%q: updates twice, the protected write last", coll), build: func(db string, sc *spellConn, v int32) []byte {
			return msg(sc, raw(sc, str("update", coll), arr("updates", bson.A{}), arr("updates", upd(v)), lsid(sc), str("$db", db)))
		}},
		{name: fmt.Sprintf("%q: $db as a document sequence, decoy in the body", coll), build: func(db string, sc *spellConn, v int32) []byte {
			return msg(sc, raw(sc, str("update", coll), arr("updates", upd(v)), lsid(sc), str("$db", db+"x")),
				wire.Sequence{Identifier: "$db", Documents: []bsoncore.Document{raw(sc, str("db", db))}})
		}},
		{name: fmt.Sprintf("%q: the command key as a document sequence, decoy in the body", coll), build: func(db string, sc *spellConn, v int32) []byte {
			return msg(sc, raw(sc, str("update", "decoy"), arr("updates", upd(v)), lsid(sc), str("$db", db)),
				wire.Sequence{Identifier: "update", Documents: []bsoncore.Document{raw(sc, str("name", coll))}})
		}},
		{name: fmt.Sprintf("%q: updates in the body and as a sequence", coll), build: func(db string, sc *spellConn, v int32) []byte {
			return msg(sc, raw(sc, str("update", coll), arr("updates", bson.A{}), lsid(sc), str("$db", db)),
				wire.Sequence{Identifier: "updates", Documents: updDocs(v)})
		}},
		{name: fmt.Sprintf("%q: updates as a sequence", coll), build: func(db string, sc *spellConn, v int32) []byte {
			return msg(sc, raw(sc, str("update", coll), lsid(sc), str("$db", db)),
				wire.Sequence{Identifier: "updates", Documents: updDocs(v)})
		}},
		{name: fmt.Sprintf("%q: OP_QUERY on db.$cmd", coll), build: func(db string, sc *spellConn, v int32) []byte {
			return opQuery(sc.next(), db+".$cmd", raw(sc, str("update", coll), arr("updates", upd(v)), lsid(sc)))
		}},
		{name: fmt.Sprintf("%q: OP_QUERY on db.$cmd, $db decoy", coll), build: func(db string, sc *spellConn, v int32) []byte {
			return opQuery(sc.next(), db+"x.$cmd", raw(sc, str("update", coll), arr("updates", upd(v)), lsid(sc), str("$db", db)))
		}},
		{name: fmt.Sprintf("create a view on %q", coll), build: func(db string, sc *spellConn, v int32) []byte {
			return msg(sc, raw(sc, str("create", "view"+strconv.Itoa(int(-v))), str("viewOn", coll), arr("pipeline", bson.A{}), lsid(sc), str("$db", db)))
		}},
	}
}

// opQuery frames a legacy OP_QUERY of query on ns, numberToReturn -1.
func opQuery(id int32, ns string, query bsoncore.Document) []byte {
	b := make([]byte, 16, 64+len(query))
	binary.LittleEndian.PutUint32(b[4:], uint32(id))
	binary.LittleEndian.PutUint32(b[12:], 2004)
	b = binary.LittleEndian.AppendUint32(b, 0) // flags
	b = append(append(b, ns...), 0)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint32(b, 0xFFFFFFFF) // -1
	b = append(b, query...)
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}
