package policy

import (
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson/primitive"
)

func TestSchemeStep(t *testing.T) {
	hf := compileScheme(&config.Scheme{Type: config.SchemeHolderFields, LeaseMS: 1000}, 30000)
	ld := compileScheme(&config.Scheme{Type: config.SchemeLockDocument}, 30000)
	fl := compileScheme(&config.Scheme{Type: config.SchemeFlag}, 30000)
	when := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	upd := func(filter D, update any) Write {
		return Write{Kind: KindUpdate, Filter: clDoc(t, filter), Update: clVal(t, update)}
	}
	del := func(filter D) Write { return Write{Kind: KindDelete, Filter: clDoc(t, filter)} }
	type want struct {
		kind        StepKind
		holder      any
		ends, renew bool
		expires     time.Time
		deleteDoc   bool
		byIdentity  bool
	}
	cases := []struct {
		name string
		s    Scheme
		w    Write
		want want
	}{
		// holderFields: the C# original's calls.
		{"hf acquire", hf, upd(D{{"_id", 1}, {"$or", A{D{{"LockId", nil}}, D{{"LockTime", D{{"$lt", when}}}}}}}, D{{"$set", D{{"LockId", "g"}, {"LockTime", when}}}}), want{kind: StepAcquire, holder: "g"}},
		{"hf holder write", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{{"$set", D{{"n", 2}}}}), want{kind: StepHolder, holder: "g"}},
		{"hf renew", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{{"$set", D{{"LockTime", when}}}}), want{kind: StepHolder, holder: "g", renew: true}},
		{"hf re-set own id", hf, upd(D{{"_id", 1}, {"LockId", D{{"$eq", "g"}}}}, D{{"$set", D{{"LockId", "g"}}}}), want{kind: StepHolder, holder: "g"}},
		{"hf release", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{{"$set", D{{"LockId", nil}, {"LockTime", nil}}}}), want{kind: StepHolder, holder: "g", ends: true}},
		{"hf release by unset", hf, upd(D{{"_id", 1}, {"$and", A{D{{"LockId", "g"}}}}}, D{{"$unset", D{{"LockId", ""}}}}), want{kind: StepHolder, holder: "g", ends: true}},
		{"hf holder delete", hf, del(D{{"_id", 1}, {"LockId", "g"}}), want{kind: StepHolder, holder: "g", ends: true, deleteDoc: true}},
		{"hf rogue update", hf, upd(D{{"_id", 1}}, D{{"$inc", D{{"n", 1}}}}), want{kind: StepOther}},
		{"hf rogue null holder", hf, upd(D{{"_id", 1}, {"LockId", nil}}, D{{"$inc", D{{"n", 1}}}}), want{kind: StepOther}},
		{"hf rogue delete", hf, del(D{{"_id", 1}}), want{kind: StepOther}},
		{"hf holder by $ne", hf, upd(D{{"_id", 1}, {"LockId", D{{"$ne", nil}}}}, D{{"$set", D{{"n", 1}}}}), want{kind: StepOther}},
		{"hf no _id", hf, upd(D{{"LockId", "g"}}, D{{"$set", D{{"n", 1}}}}), want{kind: StepOther}},
		{"hf two _ids", hf, upd(D{{"_id", D{{"$in", A{1, 2}}}}, {"LockId", "g"}}, D{{"$set", D{{"n", 1}}}}), want{kind: StepOther}},
		{"hf $inc of holder", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{{"$inc", D{{"LockId", 1}}}}), want{kind: StepOther}},
		{"hf $rename onto holder", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{{"$rename", D{{"x", "LockId"}}}}), want{kind: StepOther}},
		{"hf pipeline", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, A{D{{"$set", D{{"n", 1}}}}}), want{kind: StepOther}},
		{"hf replacement keeping holder", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{{"LockId", "g"}, {"LockTime", when}, {"n", 1}}), want{kind: StepHolder, holder: "g", renew: true}},
		{"hf replacement dropping the time", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{{"LockId", "g"}, {"n", 1}}), want{kind: StepOther}},
		{"hf replacement dropping holder", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{{"n", 1}}), want{kind: StepHolder, holder: "g", ends: true}},
		{"hf insert unlocked", hf, Write{Kind: KindInsert, Doc: clDoc(t, D{{"_id", 1}, {"LockId", nil}})}, want{kind: StepInsert}},
		{"hf insert locked", hf, Write{Kind: KindInsert, Doc: clDoc(t, D{{"_id", 1}, {"LockId", "g"}})}, want{kind: StepOther}},
		// lockDocument.
		{"ld acquire whole", ld, upd(D{{"_id", 1}, {"$or", A{D{{"Lock", nil}}, D{{"Lock.expiresAt", D{{"$lt", when}}}}}}}, D{{"$set", D{{"Lock", D{{"actor", "a"}, {"expiresAt", when}, {"error", nil}}}}}}), want{kind: StepAcquire, holder: "a", expires: when}},
		{"ld acquire by paths", ld, upd(D{{"_id", 1}, {"Lock", nil}}, D{{"$set", D{{"Lock.actor", "a"}, {"Lock.expiresAt", when}}}}), want{kind: StepAcquire, holder: "a", expires: when}},
		{"ld holder write", ld, upd(D{{"_id", 1}, {"Lock.actor", "a"}}, D{{"$set", D{{"n", 1}}}}), want{kind: StepHolder, holder: "a"}},
		{"ld extend", ld, upd(D{{"_id", 1}, {"Lock.actor", "a"}}, D{{"$set", D{{"Lock.expiresAt", when}}}}), want{kind: StepHolder, holder: "a", renew: true, expires: when}},
		{"ld release null", ld, upd(D{{"_id", 1}, {"Lock.actor", "a"}}, D{{"$set", D{{"Lock", nil}}}}), want{kind: StepHolder, holder: "a", ends: true}},
		{"ld release unset", ld, upd(D{{"_id", 1}, {"Lock.actor", "a"}}, D{{"$unset", D{{"Lock", 1}}}}), want{kind: StepHolder, holder: "a", ends: true}},
		{"ld release leaving error", ld, upd(D{{"_id", 1}, {"Lock.actor", "a"}}, D{{"$set", D{{"Lock.actor", nil}, {"Lock.error", "boom"}}}}), want{kind: StepHolder, holder: "a", ends: true}},
		{"ld write naming no holder", ld, upd(D{{"_id", 1}}, D{{"$set", D{{"n", 1}}}}), want{kind: StepHolder, byIdentity: true}},
		{"ld actor change in part", ld, upd(D{{"_id", 1}, {"Lock.actor", "a"}}, D{{"$set", D{{"Lock.actor.x", 1}}}}), want{kind: StepOther}},
		// flag.
		{"flag acquire", fl, upd(D{{"_id", 1}, {"locked", false}}, D{{"$set", D{{"locked", true}}}}), want{kind: StepAcquire}},
		{"flag write", fl, upd(D{{"_id", 1}}, D{{"$inc", D{{"n", 1}}}}), want{kind: StepHolder}},
		{"flag release", fl, upd(D{{"_id", 1}}, D{{"$set", D{{"locked", false}}}}), want{kind: StepHolder, ends: true}},
		{"flag delete", fl, del(D{{"_id", 1}}), want{kind: StepHolder, ends: true, deleteDoc: true}},
		{"flag $setOnInsert is no set", fl, upd(D{{"_id", 1}}, D{{"$set", D{{"locked", true}}}, {"$setOnInsert", D{{"locked", false}}}}), want{kind: StepAcquire}},
		{"flag multi-document", fl, upd(D{{"n", D{{"$gt", 1}}}}, D{{"$set", D{{"locked", false}}}}), want{kind: StepOther}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := SchemeStep(c.s, c.w)
			if got.Kind != c.want.kind || got.Ends != c.want.ends || got.Renew != c.want.renew || got.Delete != c.want.deleteDoc || !got.Expires.Equal(c.want.expires) || got.ByIdentity != c.want.byIdentity {
				t.Fatalf("SchemeStep = %+v, want %+v", got, c.want)
			}
			if c.want.kind == StepOther && got.Why == "" {
				t.Fatalf("StepOther without a reason")
			}
			if c.want.holder != nil {
				if s, ok := got.Holder.StringValueOK(); !ok || s != c.want.holder {
					t.Fatalf("holder = %v, want %v", got.Holder, c.want.holder)
				}
			}
		})
	}
}

func TestLockCollectionScheme(t *testing.T) {
	p, err := CompileWithLease(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{
		{Match: "shop.items", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockCollection}},
		{Match: "jobs.*", Mode: config.ModeAudit, Scheme: &config.Scheme{Type: config.SchemeLockCollection, Collection: "locks"}},
		{Match: "work.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockCollection}},
	}}, 30000)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ns, match string
		side      bool
		mirror    string
	}{
		{"shop.items", "shop.items", false, "shop.items.lock"},
		{"shop.items.lock", "shop.items", true, "shop.items.lock"},
		{"shop.other.lock", "default", false, "shop.other.lock"},
		{"jobs.a", "jobs.*", false, "jobs.locks"},
		{"jobs.locks", "jobs.*", true, "jobs.locks"},
		{"work.a.lock", "work.*", true, "work.a.lock"},
		{"work.a", "work.*", false, "work.a.lock"},
	} {
		r := p.Lookup(namespace.Of(c.ns))
		if r.Match != c.match || r.Scheme.LockSide != c.side || (r.Scheme.Active() && r.Scheme.MirrorNS(namespace.Of(c.ns)).String() != c.mirror) {
			t.Errorf("Lookup(%s) = %s side %v mirror %s, want %s side %v mirror %s", c.ns, r.Match, r.Scheme.LockSide, r.Scheme.MirrorNS(namespace.Of(c.ns)), c.match, c.side, c.mirror)
		}
	}
	data := p.Lookup(namespace.Of("shop.items")).Scheme
	side := p.Lookup(namespace.Of("shop.items.lock")).Scheme
	upd := func(filter D, update any) Write {
		return Write{Kind: KindUpdate, Filter: clDoc(t, filter), Update: clVal(t, update)}
	}
	for _, c := range []struct {
		name          string
		s             Scheme
		w             Write
		kind          StepKind
		ends, all     bool
		renew, delete bool
	}{
		{"data write", data, upd(D{{"_id", 1}}, D{{"$inc", D{{"n", 1}}}}), StepHolder, false, false, false, false},
		{"data delete is no release", data, Write{Kind: KindDelete, Filter: clDoc(t, D{{"_id", 1}})}, StepHolder, false, false, false, false},
		{"data multi", data, upd(D{{"n", 1}}, D{{"$inc", D{{"n", 1}}}}), StepOther, false, false, false, false},
		{"insert record", side, Write{Kind: KindInsert, Doc: clDoc(t, D{{"_id", 1}, {"ts", time.Now()}, {"aid", "a"}})}, StepAcquire, false, false, false, false},
		{"upsert record", side, Write{Kind: KindUpdate, Upsert: true, Filter: clDoc(t, D{{"_id", 1}}), Update: clVal(t, D{{"$setOnInsert", D{{"aid", "a"}, {"ts", time.Now()}}}})}, StepAcquire, false, false, false, false},
		{"findAndModify upsert", side, Write{Kind: KindFindAndModify, Upsert: true, Filter: clDoc(t, D{{"_id", 1}}), Update: clVal(t, D{{"$setOnInsert", D{{"aid", "a"}}}})}, StepOther, false, false, false, false},
		{"refresh", side, upd(D{{"_id", 1}}, D{{"$set", D{{"ts", time.Now()}}}}), StepHolder, false, false, true, false},
		{"release", side, Write{Kind: KindDelete, Filter: clDoc(t, D{{"_id", 1}})}, StepHolder, true, false, false, false},
		{"release all", side, Write{Kind: KindDelete, Filter: clDoc(t, D{{"aid", "a"}})}, StepHolder, true, true, false, false},
		{"delete by ts", side, Write{Kind: KindDelete, Filter: clDoc(t, D{{"ts", D{{"$lt", 5}}}})}, StepOther, false, false, false, false},
	} {
		got := SchemeStep(c.s, c.w)
		if got.Kind != c.kind || got.Ends != c.ends || got.ReleaseAll != c.all || got.Renew != c.renew || got.Delete != c.delete {
			t.Errorf("%s: SchemeStep = %+v", c.name, got)
		}
	}
}

// TestSchemeEffects: a write is read by what it does to a document that
// exists ($setOnInsert sets nothing there; a replacement removes what it
// omits) and, for an upsert, to the document it would insert: the
// examples of issue 22 that passed as acquires, holder writes or clears.
func TestSchemeEffects(t *testing.T) {
	hf := compileScheme(&config.Scheme{Type: config.SchemeHolderFields, LeaseMS: 1000}, 30000)
	ld := compileScheme(&config.Scheme{Type: config.SchemeLockDocument}, 30000)
	th := compileScheme(&config.Scheme{Type: config.SchemeLockDocument, Field: "Lock", ActorField: "Actor", ExpiresField: "ExpireTime", HolderField: "LockKey"}, 30000)
	fl := compileScheme(&config.Scheme{Type: config.SchemeFlag}, 30000)
	when := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	upd := func(filter D, update any) Write {
		return Write{Kind: KindUpdate, Filter: clDoc(t, filter), Update: clVal(t, update)}
	}
	ups := func(filter D, update any) Write { w := upd(filter, update); w.Upsert = true; return w }
	fam := func(filter D, update any) Write {
		return Write{Kind: KindFindAndModify, Filter: clDoc(t, filter), Update: clVal(t, update)}
	}
	type want struct {
		kind                                        StepKind
		ends, renew, now, touches, ident, flagFalse bool
	}
	other := want{kind: StepOther}
	cases := []struct {
		name string
		s    Scheme
		w    Write
		want want
	}{
		{"hf $setOnInsert holder with data", hf, upd(D{{"_id", 1}}, D{{"$setOnInsert", D{{"LockId", "x"}}}, {"$set", D{{"value", 7000}}}}), other},
		{"hf findAndModify of $setOnInsert alone", hf, fam(D{{"_id", 1}}, D{{"$setOnInsert", D{{"LockId", "x"}}}}), other},
		{"hf upsert of $setOnInsert alone", hf, ups(D{{"_id", 1}}, D{{"$setOnInsert", D{{"LockId", "x"}, {"LockTime", when}}}}), other},
		{"hf acquire with data", hf, upd(D{{"_id", 1}}, D{{"$set", D{{"LockId", "x"}, {"LockTime", when}, {"value", 7000}}}}), other},
		{"hf acquire renaming data in", hf, upd(D{{"_id", 1}}, D{{"$set", D{{"LockId", "x"}, {"LockTime", when}}}, {"$rename", D{{"LockTime2", "value"}}}}), other},
		{"hf acquire without a time", hf, upd(D{{"_id", 1}}, D{{"$set", D{{"LockId", "x"}}}}), other},
		{"hf acquire with a time that is no date", hf, upd(D{{"_id", 1}}, D{{"$set", D{{"LockId", "x"}, {"LockTime", 5}}}}), other},
		{"hf acquire to an array", hf, upd(D{{"_id", 1}}, D{{"$set", D{{"LockId", A{"x"}}, {"LockTime", when}}}}), other},
		{"hf acquire by $currentDate", hf, upd(D{{"_id", 1}, {"LockId", nil}}, D{{"$set", D{{"LockId", "x"}}}, {"$currentDate", D{{"LockTime", true}}}}), want{kind: StepAcquire, now: true}},
		{"hf upsert acquire", hf, ups(D{{"_id", 1}, {"LockId", nil}}, D{{"$set", D{{"LockId", "x"}, {"LockTime", when}}}}), want{kind: StepAcquire}},
		{"hf upsert acquire inserting another holder", hf, ups(D{{"_id", 1}}, D{{"$set", D{{"LockTime", when}}}, {"$setOnInsert", D{{"LockId", "y"}}}}), other},
		{"hf renew by $currentDate", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{{"$currentDate", D{{"LockTime", D{{"$type", "date"}}}}}}), want{kind: StepHolder, renew: true, now: true}},
		{"hf renew to a timestamp", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{{"$currentDate", D{{"LockTime", D{{"$type", "timestamp"}}}}}}), other},
		{"hf renew to a number", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{{"$set", D{{"LockTime", 5}}}}), other},
		{"hf holder drops the time", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{{"$unset", D{{"LockTime", ""}}}}), other},
		{"hf regex holder", hf, upd(D{{"_id", 1}, {"LockId", primitive.Regex{Pattern: "."}}}, D{{"$set", D{{"n", 1}}}}), other},
		{"hf $eq regex holder", hf, upd(D{{"_id", 1}, {"LockId", D{{"$eq", primitive.Regex{Pattern: "."}}}}}, D{{"$set", D{{"n", 1}}}}), other},
		{"hf array holder", hf, upd(D{{"_id", 1}, {"LockId", A{"g"}}}, D{{"$set", D{{"n", 1}}}}), other},
		{"hf upsert naming a holder", hf, ups(D{{"_id", 1}, {"LockId", "x"}}, D{{"$set", D{{"n", 1}}}}), other},
		{"hf holder write", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{{"$set", D{{"n", 1}}}}), want{kind: StepHolder, touches: true}},
		{"hf holder's replacement releasing", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{{"n", 1}}), want{kind: StepHolder, ends: true, touches: true}},
		{"hf empty replacement", hf, upd(D{{"_id", 1}, {"LockId", "g"}}, D{}), want{kind: StepHolder, ends: true, touches: true}},
		{"ld $setOnInsert holder with data", ld, upd(D{{"_id", 1}}, D{{"$setOnInsert", D{{"Lock.actor", "x"}}}, {"$set", D{{"value", 7000}}}}), want{kind: StepHolder, touches: true, ident: true}},
		{"ld acquire with an expiry that is no date", ld, upd(D{{"_id", 1}}, D{{"$set", D{{"Lock", D{{"actor", "x"}, {"expiresAt", 5}}}}}}), other},
		{"ld acquire without an expiry", ld, upd(D{{"_id", 1}}, D{{"$set", D{{"Lock.actor", "x"}}}}), other},
		{"ld extension that is no date", ld, upd(D{{"_id", 1}, {"Lock.actor", "a"}}, D{{"$set", D{{"Lock.expiresAt", "soon"}}}}), other},
		{"ld insert of a lock that is no document", ld, Write{Kind: KindInsert, Doc: clDoc(t, D{{"_id", 1}, {"Lock", "x"}})}, other},
		{"ld lock set to a number", ld, upd(D{{"_id", 1}, {"Lock.actor", "a"}}, D{{"$set", D{{"Lock", 5}}}}), other},
		{"ld replacement with a lock array", ld, upd(D{{"_id", 1}, {"Lock.actor", "a"}}, D{{"n", 1}, {"Lock", A{}}}), other},
		{"ld upsert naming a holder", ld, ups(D{{"_id", 1}, {"Lock.actor", "a"}}, D{{"$set", D{{"n", 1}}}}), other},
		{"tharga acquire", th, fam(D{{"_id", 1}, {"Lock", nil}}, D{{"$set", D{{"Lock", D{{"LockKey", "k"}, {"LockTime", when}, {"ExpireTime", when}, {"Actor", "w"}}}}}}), want{kind: StepAcquire}},
		{"tharga commit", th, Write{Kind: KindFindAndModify, Filter: clDoc(t, D{{"_id", 1}, {"Lock", D{{"$ne", nil}}}, {"Lock.LockKey", "k"}}), Update: clVal(t, D{{"_id", 1}, {"value", 2}, {"Lock", nil}})}, want{kind: StepHolder, ends: true, touches: true}},
		{"tharga abandon", th, fam(D{{"_id", 1}}, D{{"$set", D{{"Lock", nil}}}}), want{kind: StepHolder, ends: true, ident: true}},
		{"tharga actor is no holder", th, upd(D{{"_id", 1}, {"Lock.Actor", "w"}}, D{{"$set", D{{"n", 1}}}}), want{kind: StepHolder, touches: true, ident: true}},
		{"flag replacement without it", fl, upd(D{{"_id", 1}}, D{{"value", 7000}}), other},
		{"flag replacement clearing it", fl, upd(D{{"_id", 1}}, D{{"value", 7000}, {"locked", false}}), want{kind: StepHolder, ends: true, touches: true, flagFalse: true}},
		{"flag clear and data", fl, upd(D{{"_id", 1}}, D{{"$set", D{{"locked", false}, {"value", 7000}}}}), want{kind: StepHolder, ends: true, touches: true, flagFalse: true}},
		{"flag unset both", fl, upd(D{{"_id", 1}}, D{{"$unset", D{{"locked", ""}, {"value", ""}}}}), other},
		{"flag set to 1", fl, upd(D{{"_id", 1}}, D{{"$set", D{{"locked", 1}, {"value", 7000}}}}), other},
		{"flag true and data", fl, upd(D{{"_id", 1}, {"locked", false}}, D{{"$set", D{{"locked", true}, {"value", 7000}}}}), want{kind: StepHolder, touches: true}},
		{"flag $setOnInsert true with data", fl, upd(D{{"_id", 1}}, D{{"$setOnInsert", D{{"locked", true}}}, {"$set", D{{"value", 7000}}}}), want{kind: StepHolder, touches: true}},
		{"flag unset alone", fl, upd(D{{"_id", 1}}, D{{"$unset", D{{"locked", ""}}}}), other},
		{"flag set null", fl, upd(D{{"_id", 1}}, D{{"$set", D{{"locked", nil}}}}), other},
		{"flag back to false alone", fl, upd(D{{"_id", 1}}, D{{"$set", D{{"locked", false}}}}), want{kind: StepHolder, ends: true, flagFalse: true}},
		{"flag upsert creating it set", fl, ups(D{{"_id", 1}, {"locked", true}}, D{{"$set", D{{"n", 1}}}}), other},
		{"flag upsert creating it clear", fl, ups(D{{"_id", 1}, {"locked", false}}, D{{"$set", D{{"n", 1}}}}), want{kind: StepHolder, touches: true}},
		{"flag upsert acquire", fl, ups(D{{"_id", 1}, {"locked", false}}, D{{"$set", D{{"locked", true}}}}), want{kind: StepAcquire}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := SchemeStep(c.s, c.w)
			if got.Kind != c.want.kind || got.Ends != c.want.ends || got.Renew != c.want.renew || got.TimeNow != c.want.now ||
				(c.want.kind == StepHolder && (got.Touches != c.want.touches || got.ByIdentity != c.want.ident || got.FlagFalse != c.want.flagFalse)) {
				t.Fatalf("SchemeStep = %+v, want %+v", got, c.want)
			}
			if c.want.kind == StepOther && got.Why == "" {
				t.Fatalf("StepOther without a reason")
			}
		})
	}
}

func TestSchemeFreeCondition(t *testing.T) {
	hf := compileScheme(&config.Scheme{Type: config.SchemeHolderFields, LeaseMS: 1000}, 30000)
	th := compileScheme(&config.Scheme{Type: config.SchemeLockDocument, Field: "Lock", ActorField: "Actor", ExpiresField: "ExpireTime", HolderField: "LockKey"}, 30000)
	fl := compileScheme(&config.Scheme{Type: config.SchemeFlag}, 30000)
	now := time.UnixMilli(10000)
	for _, c := range []struct {
		s    Scheme
		want string
	}{
		{hf, `{"$or": [{"LockId": null},{"LockTime": {"$lt": {"$date":{"$numberLong":"9000"}}}}]}`},
		{th, `{"$or": [{"Lock.LockKey": null},{"Lock.ExpireTime": {"$lt": {"$date":{"$numberLong":"10000"}}}}]}`},
		{fl, `{"locked": {"$ne": true}}`},
	} {
		if got := c.s.FreeCondition(now).String(); got != c.want {
			t.Errorf("%s FreeCondition = %s, want %s", c.s.Type, got, c.want)
		}
	}
	body := clDoc(t, D{{"update", "c"}, {"updates", A{D{{"q", D{{"_id", 1}, {"$and", A{D{{"a", 1}}}}}}, {"u", D{{"$set", D{{"locked", true}}}}}}}}})
	got, err := JoinFilter(body, Write{List: "updates", FilterKey: "q"}, fl.FreeCondition(now))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"update": "c","updates": [{"q": {"_id": {"$numberInt":"1"},"$and": [{"locked": {"$ne": true}},{"a": {"$numberInt":"1"}}]},"u": {"$set": {"locked": true}}}]}`; got.String() != want {
		t.Fatalf("JoinFilter = %s, want %s", got, want)
	}
	// Each statement's filter is where its Write says it is: the
	// findAndModify query (added when absent), a bulkWrite op's filter;
	// a legacy selector has no field to join.
	fam := clDoc(t, D{{"findAndModify", "c"}, {"update", D{{"$set", D{{"locked", true}}}}}})
	got, err = JoinFilter(fam, Write{FilterKey: "query"}, fl.FreeCondition(now))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"findAndModify": "c","update": {"$set": {"locked": true}},"query": {"locked": {"$ne": true}}}`; got.String() != want {
		t.Errorf("JoinFilter of findAndModify = %s, want %s", got, want)
	}
	ops := clDoc(t, D{{"bulkWrite", 1}, {"ops", A{D{{"update", 0}, {"filter", D{{"_id", 1}}}, {"updateMods", D{}}}}}})
	got, err = JoinFilter(ops, Write{List: "ops", FilterKey: "filter"}, fl.FreeCondition(now))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"bulkWrite": {"$numberInt":"1"},"ops": [{"update": {"$numberInt":"0"},"filter": {"_id": {"$numberInt":"1"},"$and": [{"locked": {"$ne": true}}]},"updateMods": {}}]}`; got.String() != want {
		t.Errorf("JoinFilter of a bulkWrite op = %s, want %s", got, want)
	}
	if _, err := JoinFilter(body, Write{List: ListLegacy}, fl.FreeCondition(now)); err == nil {
		t.Error("JoinFilter joined a legacy selector")
	}
}

// TestSchemePick: a findOneAndUpdate acquire whose filter names no one
// _id (Tharga.MongoDB's pick by filter) is an acquire of one of several;
// nothing else that names no _id is a step.
func TestSchemePick(t *testing.T) {
	th := compileScheme(&config.Scheme{Type: config.SchemeLockDocument, Field: "Lock", ActorField: "Actor", ExpiresField: "ExpireTime", HolderField: "LockKey"}, 30000)
	fl := compileScheme(&config.Scheme{Type: config.SchemeFlag}, 30000)
	when := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	set := clVal(t, D{{"$set", D{{"Lock", D{{"LockKey", "k"}, {"ExpireTime", when}}}}}})
	group := clDoc(t, D{{"$or", A{D{{"Group", "g"}, {"Lock", nil}}}}})
	for _, c := range []struct {
		name string
		s    Scheme
		w    Write
		pick bool
	}{
		{"pick", th, Write{Kind: KindFindAndModify, Filter: group, Update: set}, true},
		{"pick with a sort", th, Write{Kind: KindFindAndModify, Filter: group, Update: set, Sort: clDoc(t, D{{"_id", 1}})}, false},
		{"pick as an upsert", th, Write{Kind: KindFindAndModify, Filter: group, Update: set, Upsert: true}, false},
		{"update of several", th, Write{Kind: KindUpdate, Filter: group, Update: set}, false},
		{"data write of several", th, Write{Kind: KindFindAndModify, Filter: group, Update: clVal(t, D{{"$set", D{{"n", 1}}}})}, false},
		{"flag pick", fl, Write{Kind: KindFindAndModify, Filter: clDoc(t, D{{"locked", false}}), Update: clVal(t, D{{"$set", D{{"locked", true}}}})}, false},
	} {
		got := SchemeStep(c.s, c.w)
		if got.Pick != c.pick || (c.pick && (got.Kind != StepAcquire || got.ID.Type != 0)) || (!c.pick && got.Kind != StepOther) {
			t.Errorf("%s: SchemeStep = %+v", c.name, got)
		}
	}
}
