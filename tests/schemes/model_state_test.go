package schemes

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/bson/primitive"
)

// What the model reads after every step: the documents (and lock records)
// straight from the upstream, and the mirrors from lockgate's lock store
// through the lockStatus command.

type mirrorState struct {
	held    bool
	app     string
	session string // the owner's prefix: for holderFields and lockDocument, keyed from the holder value
	actor   string
	expires time.Time
}

type snap struct {
	at, done time.Time // before the first read, after the last
	docs     map[int32]bson.Raw
	recs     map[int32]bson.Raw // lockCollection's records
	mir      map[int32]mirrorState
}

// numID reads a numeric _id as the tracked int32 it stands for.
func numID(v bson.RawValue) (int32, bool) {
	switch v.Type {
	case bsontype.Int32:
		return v.Int32(), true
	case bsontype.Int64:
		return int32(v.Int64()), true
	case bsontype.Double:
		return int32(v.Double()), true
	}
	return 0, false
}

func (m *model) readColl(ctx context.Context, coll string) (map[int32]bson.Raw, error) {
	out := map[int32]bson.Raw{}
	cur, err := m.direct.Database(m.db).Collection(coll).Find(ctx, bson.D{{"_id", bson.D{{"$in", m.idList()}}}})
	if err != nil {
		return nil, err
	}
	defer cur.Close(ctx)
	for cur.Next(ctx) {
		raw := append(bson.Raw(nil), cur.Current...)
		if id, ok := numID(raw.Lookup("_id")); ok {
			if _, dup := out[id]; dup {
				m.notes = append(m.notes, fmt.Sprintf("two documents answer _id %d", id))
			}
			out[id] = raw
		}
	}
	return out, cur.Err()
}

func (m *model) idList() bson.A {
	a := bson.A{}
	for _, id := range m.ids {
		a = append(a, id)
	}
	return a
}

func (m *model) snapshot() snap {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := snap{at: time.Now(), recs: map[int32]bson.Raw{}, mir: map[int32]mirrorState{}}
	var err error
	if s.docs, err = m.readColl(ctx, m.coll); err != nil {
		m.t.Fatalf("seed %d step %d: reading the documents: %v", m.seed, m.step, err)
	}
	mirrorColl := m.coll
	if m.kind == "lockCollection" {
		mirrorColl = m.lockColl
		if s.recs, err = m.readColl(ctx, m.lockColl); err != nil {
			m.t.Fatalf("seed %d step %d: reading the lock records: %v", m.seed, m.step, err)
		}
	}
	var st struct {
		Locks []struct {
			ID     bson.RawValue `bson:"_id"`
			Held   bool          `bson:"held"`
			Holder *struct {
				App string `bson:"app"`
				Tag string `bson:"tag"`
			} `bson:"holder"`
			ExpiresAt *primitive.DateTime `bson:"expiresAt"`
		} `bson:"locks"`
	}
	for try := 1; ; try++ {
		err := m.observer.Database(m.db).RunCommand(ctx, bson.D{{"lockStatus", mirrorColl}, {"ids", m.idList()}}).Decode(&st)
		if err == nil {
			break
		}
		// The snapshot reads the state; it does not judge lockgate's
		// answer. A lock store that did not answer within its timeout
		// (the embedded upstream stalled 5 s at load 13, beside the race
		// detector's packages) is read again.
		if try == 3 || !strings.Contains(err.Error(), "the lock store is unreachable") {
			m.t.Fatalf("seed %d step %d: lockStatus (try %d): %v", m.seed, m.step, try, err)
		}
		m.t.Logf("seed %d step %d: lockStatus, read again: %v", m.seed, m.step, err)
	}
	for _, l := range st.Locks {
		id, ok := numID(l.ID)
		if !ok || !l.Held {
			continue
		}
		ms := mirrorState{held: true}
		if l.Holder != nil {
			ms.app, ms.session = l.Holder.App, l.Holder.Tag
			ms.actor = actorOfApp(ms.app)
		}
		if l.ExpiresAt != nil {
			ms.expires = l.ExpiresAt.Time()
		}
		s.mir[id] = ms
	}
	s.done = time.Now()
	return s
}

func actorOfApp(app string) string {
	if a, ok := strings.CutPrefix(app, "model-"); ok {
		return a
	}
	return "?" + app
}

// ownerOfValue is the actor a holder value belongs to: followers' values
// are "F1-<n>" and "F2-<n>"; whatever else is in a holder field, the
// rogue put there.
func ownerOfValue(v bson.RawValue) string {
	if s, ok := v.StringValueOK(); ok {
		for _, f := range []string{"F1", "F2"} {
			if strings.HasPrefix(s, f+"-") {
				return f
			}
		}
	}
	return "R"
}

func isNullish(v bson.RawValue) bool {
	return v.Type == 0 || v.Type == bsontype.Null || v.Type == bsontype.Undefined
}

// view is one document's lock as the scheme reads it.
type view struct {
	present bool   // the document (lockCollection: the record) exists
	holder  string // the actor holding it by the document ("" free); flag and lockCollection: by the mirror
	val     string // the holder value, lock sub-document, flag or aid, for messages
	hval    string // the holder value (holderFields, lockDocument)
	exp     time.Time
	bad     string // a held lock whose expiry the scheme cannot read
	clean   bool   // lock fields of the scheme's own types: the follower's acquire filter can be evaluated
	free    bool   // the follower's acquire filter matches without looking at the expiry
	flag    bson.RawValue
}

func rawString(v bson.RawValue) string {
	if v.Type == 0 {
		return "<missing>"
	}
	return v.String()
}

func (m *model) view(s snap, id int32) view {
	var v view
	switch m.kind {
	case "holderFields":
		d := s.docs[id]
		if d == nil {
			return view{free: true, clean: true}
		}
		v.present = true
		lid, lt := d.Lookup("LockId"), d.Lookup("LockTime")
		v.val = rawString(lid)
		if isNullish(lid) {
			v.free, v.clean = true, true
			return v
		}
		v.holder, v.hval = ownerOfValue(lid), rawString(lid)
		if lt.Type == bsontype.DateTime {
			v.exp = lt.Time().Add(modelLease)
			v.clean = lid.Type == bsontype.String
		} else {
			v.bad = "LockTime is " + rawString(lt)
		}
	case "lockDocument":
		d := s.docs[id]
		if d == nil {
			return view{clean: true}
		}
		v.present = true
		l := d.Lookup("Lock")
		v.val = rawString(l)
		if isNullish(l) {
			v.free, v.clean = true, true
			return v
		}
		ld, ok := l.DocumentOK()
		if !ok {
			v.free = true // "Lock.actor": null matches a scalar Lock
			return v
		}
		actor := ld.Lookup("actor")
		if isNullish(actor) {
			v.free, v.clean = true, true
			return v
		}
		v.holder, v.hval = ownerOfValue(actor), rawString(actor)
		if ex := ld.Lookup("expiresAt"); ex.Type == bsontype.DateTime {
			v.exp = ex.Time()
			v.clean = actor.Type == bsontype.String
		} else {
			v.bad = "Lock.expiresAt is " + rawString(ex)
		}
	case "flag":
		d := s.docs[id]
		if d == nil {
			return view{clean: true}
		}
		v.present = true
		v.flag = d.Lookup("locked")
		v.val = rawString(v.flag)
		b, ok := v.flag.BooleanOK()
		v.clean = ok
		v.free = ok && !b
		if mr := s.mir[id]; mr.held {
			v.holder = mr.actor
		}
	case "lockCollection":
		r := s.recs[id]
		if r == nil {
			return view{free: true, clean: true}
		}
		v.present = true
		aid, ts := r.Lookup("aid"), r.Lookup("ts")
		v.val = rawString(aid)
		if mr := s.mir[id]; mr.held {
			v.holder = mr.actor
		}
		if ts.Type == bsontype.DateTime {
			v.exp = ts.Time().Add(modelLease)
			v.clean = true
		} else {
			v.bad = "ts is " + rawString(ts)
		}
	}
	return v
}

// lockFields are the scheme's lock fields of a document (or its record),
// as bytes to compare.
func (m *model) lockFields(s snap, id int32) string {
	if m.kind == "lockCollection" {
		if r := s.recs[id]; r != nil {
			return r.String()
		}
		return "<no record>"
	}
	d := s.docs[id]
	if d == nil {
		return "<absent>"
	}
	var b strings.Builder
	for _, f := range m.lockRoots() {
		b.WriteString(f + "=" + rawString(d.Lookup(f)) + ";")
	}
	return b.String()
}

func (m *model) lockRoots() []string {
	switch m.kind {
	case "holderFields":
		return []string{"LockId", "LockTime"}
	case "lockDocument":
		return []string{"Lock"}
	case "flag":
		return []string{"locked"}
	}
	return nil
}

// dataOf is the document without its _id and lock fields.
func (m *model) dataOf(d bson.Raw) string {
	if d == nil {
		return "<absent>"
	}
	elems, _ := d.Elements()
	lock := map[string]bool{"_id": true}
	for _, f := range m.lockRoots() {
		lock[f] = true
	}
	var parts []string
	for _, e := range elems {
		if !lock[e.Key()] {
			parts = append(parts, e.Key()+":"+e.Value().String())
		}
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// describe is the state of every tracked document, for the history.
func (m *model) describe(s snap) string {
	var parts []string
	ids := append([]int32(nil), m.ids...)
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		var b strings.Builder
		fmt.Fprintf(&b, "_id %d: ", id)
		if d := s.docs[id]; d != nil {
			b.WriteString(d.String())
		} else {
			b.WriteString("<absent>")
		}
		if m.kind == "lockCollection" {
			if r := s.recs[id]; r != nil {
				b.WriteString(" record " + r.String())
			} else {
				b.WriteString(" no record")
			}
		}
		if mr := s.mir[id]; mr.held {
			fmt.Fprintf(&b, " mirror %s for %dms", mr.actor, mr.expires.Sub(s.done).Milliseconds())
		} else {
			b.WriteString(" mirror free")
		}
		parts = append(parts, b.String())
	}
	return strings.Join(parts, " | ")
}

// clock is a wall-clock time to the millisecond, for the reports.
func clock(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("15:04:05.000")
}

// times is when a step's write was sent and answered and when the state
// after it was read: a report tells a slow step from a wrong one by them.
func (e entry) times() string {
	return fmt.Sprintf("sent %s, answered %s, state read %s to %s", clock(e.t0), clock(e.t1), clock(e.read), clock(e.readDone))
}

// storeHistory is every generation the lock store keeps of the mirror of
// id (its claims, oldest first) and its head document, read straight
// from the lock store's collections: what a report needs to tell a lock
// store that lost a grant from a mirror that ran out.
func (m *model) storeHistory(id int32) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mns := m.db + "." + m.coll
	if m.kind == "lockCollection" {
		mns = m.db + "." + m.lockColl
	}
	db := m.direct.Database(baseCfg.Lockstore.Database)
	var b strings.Builder
	for _, c := range []struct{ coll, what string }{{baseCfg.Lockstore.Collection + "_claims", "claim"}, {baseCfg.Lockstore.Collection, "head"}} {
		cur, err := db.Collection(c.coll).Find(ctx, bson.D{{"ns", mns}})
		if err != nil {
			fmt.Fprintf(&b, "    reading %s: %v\n", c.coll, err)
			continue
		}
		var gens []bson.Raw
		for cur.Next(ctx) {
			if got, ok := numID(cur.Current.Lookup("id")); ok && got == id {
				gens = append(gens, append(bson.Raw(nil), cur.Current...))
			}
		}
		cur.Close(ctx)
		sort.Slice(gens, func(i, j int) bool {
			a, _ := gens[i].Lookup("seq").AsInt64OK()
			b, _ := gens[j].Lookup("seq").AsInt64OK()
			return a < b
		})
		for _, g := range gens {
			at := func(k string) time.Time {
				if v, ok := g.Lookup(k).DateTimeOK(); ok {
					return time.UnixMilli(v)
				}
				return time.Time{}
			}
			str := func(k string) string {
				s, _ := g.Lookup(k).StringValueOK()
				return s
			}
			num := func(k string) int64 {
				n, _ := g.Lookup(k).AsInt64OK()
				return n
			}
			fmt.Fprintf(&b, "    %s seq %d %s by %q via %.8s token %d at %s, expires %s\n", c.what, num("seq"),
				str("kind"), str("ownerApp"), str("via"), num("token"), clock(at("at")), clock(at("expiresAt")))
		}
	}
	return b.String()
}
