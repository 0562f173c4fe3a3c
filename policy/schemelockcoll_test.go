package policy

import (
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
)

// TestLockCollectionSteps: what each write to a lock collection, or to a
// document under one, is (docs/SCHEMES.md, lockCollection): the record an
// acquire creates must be told exactly, with a date expiry; a refresh
// moves nothing but the record's time; records follow the recordId
// template.
func TestLockCollectionSteps(t *testing.T) {
	p, err := CompileWithLease(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{
		{Match: "cc.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockCollection}},
		{Match: "aj.*", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeLockCollection,
			Collection: "resourceLocks", RecordID: "lock_{_id}", ExpiresField: "ExpireAt"}},
	}}, 30000)
	if err != nil {
		t.Fatal(err)
	}
	cc, ccData := p.Lookup(namespace.Of("cc.w.lock")).Scheme, p.Lookup(namespace.Of("cc.w")).Scheme
	aj, ajData := p.Lookup(namespace.Of("aj.resourceLocks")).Scheme, p.Lookup(namespace.Of("aj.items")).Scheme
	if !cc.LockSide || !aj.LockSide || ajData.LockSide {
		t.Fatalf("lock sides: %+v %+v %+v", cc, aj, ajData)
	}
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	end := now.Add(30 * time.Second) // a codecentric record's: ts + leaseMS
	upd := func(filter D, update any, upsert bool) Write {
		return Write{Kind: KindUpdate, Filter: clDoc(t, filter), Update: clVal(t, update), Upsert: upsert}
	}
	fam := func(filter D, update any) Write {
		return Write{Kind: KindFindAndModify, Filter: clDoc(t, filter), Update: clVal(t, update), Upsert: true}
	}
	ins := func(doc D) Write { return Write{Kind: KindInsert, Doc: clDoc(t, doc)} }
	del := func(filter D) Write { return Write{Kind: KindDelete, Filter: clDoc(t, filter)} }
	type want struct {
		kind    StepKind
		id      any // the step's _id (the mirror's)
		holder  any
		ends    bool
		all     bool
		renew   bool
		expires time.Time
		anyEnd  bool // the server's now: not checked
	}
	for _, c := range []struct {
		name string
		s    Scheme
		w    Write
		want want
	}{
		// codecentric: {_id, ts, aid}.
		{"insert", cc, ins(D{{"_id", 1}, {"ts", now}, {"aid", "A"}}), want{kind: StepAcquire, id: int32(1), holder: "A", expires: end}},
		{"insert without aid", cc, ins(D{{"_id", 1}, {"ts", now}}), want{kind: StepAcquire, id: int32(1), expires: end}},
		{"insert ts a number", cc, ins(D{{"_id", 1}, {"ts", 1}, {"aid", "A"}}), want{kind: StepOther}},
		{"insert ts missing", cc, ins(D{{"_id", 1}, {"aid", "A"}}), want{kind: StepOther}},
		{"upsert $setOnInsert", cc, upd(D{{"_id", 1}}, D{{"$setOnInsert", D{{"ts", now}, {"aid", "A"}}}}, true), want{kind: StepAcquire, id: int32(1), holder: "A", expires: end}},
		{"upsert $set", cc, upd(D{{"_id", 1}}, D{{"$set", D{{"ts", now}, {"aid", "R"}}}}, true), want{kind: StepAcquire, id: int32(1), holder: "R", expires: end}},
		{"upsert $currentDate", cc, upd(D{{"_id", 1}}, D{{"$currentDate", D{{"ts", true}}}, {"$setOnInsert", D{{"aid", "A"}}}}, true), want{kind: StepAcquire, id: int32(1), holder: "A", anyEnd: true}},
		{"upsert $currentDate timestamp", cc, upd(D{{"_id", 1}}, D{{"$currentDate", D{{"ts", D{{"$type", "timestamp"}}}}}}, true), want{kind: StepOther}},
		{"upsert $inc", cc, upd(D{{"_id", 1}}, D{{"$setOnInsert", D{{"ts", now}}}, {"$inc", D{{"n", 1}}}}, true), want{kind: StepOther}},
		{"upsert filter $eq", cc, upd(D{{"_id", D{{"$eq", 1}}}}, D{{"$setOnInsert", D{{"ts", now}}}}, true), want{kind: StepOther}},
		{"upsert filter with aid", cc, upd(D{{"_id", 1}, {"aid", "A"}}, D{{"$setOnInsert", D{{"ts", now}}}}, true), want{kind: StepOther}},
		{"upsert field twice", cc, upd(D{{"_id", 1}}, D{{"$set", D{{"ts", now}}}, {"$setOnInsert", D{{"ts", now}}}}, true), want{kind: StepOther}},
		{"upsert in part", cc, upd(D{{"_id", 1}}, D{{"$set", D{{"ts", now}, {"aid.x", 1}}}}, true), want{kind: StepOther}},
		{"upsert replacement", cc, upd(D{{"_id", 1}}, D{{"ts", now}, {"aid", "A"}}, true), want{kind: StepAcquire, id: int32(1), holder: "A", expires: end}},
		{"upsert pipeline", cc, Write{Kind: KindUpdate, Upsert: true, Filter: clDoc(t, D{{"_id", 1}}), Update: clVal(t, bson.A{D{{"$set", D{{"ts", "$$NOW"}}}}})}, want{kind: StepOther}},
		{"findAndModify upsert $set", cc, fam(D{{"_id", 1}}, D{{"$set", D{{"ts", now}}}}), want{kind: StepOther}},
		{"refresh", cc, upd(D{{"_id", 1}}, D{{"$set", D{{"ts", now}}}}, false), want{kind: StepHolder, id: int32(1), renew: true, expires: end}},
		{"refresh $currentDate", cc, upd(D{{"_id", 1}}, D{{"$currentDate", D{{"ts", D{{"$type", "date"}}}}}}, false), want{kind: StepHolder, id: int32(1), renew: true}},
		{"other field", cc, upd(D{{"_id", 1}}, D{{"$set", D{{"note", "x"}}}}, false), want{kind: StepHolder, id: int32(1)}},
		{"refresh ts a string", cc, upd(D{{"_id", 1}}, D{{"$set", D{{"ts", "now"}}}}, false), want{kind: StepOther}},
		{"refresh $unset ts", cc, upd(D{{"_id", 1}}, D{{"$unset", D{{"ts", ""}}}}, false), want{kind: StepOther}},
		{"refresh $inc ts", cc, upd(D{{"_id", 1}}, D{{"$inc", D{{"ts", 1}}}}, false), want{kind: StepOther}},
		{"refresh moves aid", cc, upd(D{{"_id", 1}}, D{{"$set", D{{"ts", now}, {"aid", "Z"}}}}, false), want{kind: StepOther}},
		{"refresh unsets aid", cc, upd(D{{"_id", 1}}, D{{"$unset", D{{"aid", ""}}}}, false), want{kind: StepOther}},
		{"rename onto aid", cc, upd(D{{"_id", 1}}, D{{"$rename", D{{"x", "aid"}}}}, false), want{kind: StepOther}},
		{"rename onto ts", cc, upd(D{{"_id", 1}}, D{{"$rename", D{{"x", "ts"}}}}, false), want{kind: StepOther}},
		{"replacement", cc, upd(D{{"_id", 1}}, D{{"ts", now}, {"aid", "A"}}, false), want{kind: StepOther}},
		{"release by _id", cc, del(D{{"_id", 1}}), want{kind: StepHolder, id: int32(1), ends: true}},
		{"release by _id and aid", cc, del(D{{"_id", 1}, {"aid", "A"}}), want{kind: StepHolder, id: int32(1), ends: true}},
		{"release all", cc, del(D{{"aid", "A"}}), want{kind: StepHolder, holder: "A", ends: true, all: true}},
		{"release all by regex", cc, del(D{{"aid", primitive.Regex{Pattern: "."}}}), want{kind: StepOther}},
		{"release all by operator", cc, del(D{{"aid", D{{"$ne", "B"}}}}), want{kind: StepOther}},
		{"findAndModify remove", cc, Write{Kind: KindFindAndModify, Remove: true, Filter: clDoc(t, D{{"_id", 1}})}, want{kind: StepHolder, id: int32(1), ends: true}},
		{"data write", ccData, upd(D{{"_id", 1}}, D{{"$inc", D{{"n", 1}}}}, false), want{kind: StepHolder, id: int32(1)}},

		// alistairjevans: {_id: "lock_<id>", ExpireAt}.
		{"aj acquire", aj, fam(D{{"_id", "lock_r"}}, D{{"$setOnInsert", D{{"_id", "lock_r"}, {"ExpireAt", now}}}}), want{kind: StepAcquire, id: "lock_r", expires: now}},
		{"aj acquire other _id", aj, fam(D{{"_id", "lock_r"}}, D{{"$setOnInsert", D{{"_id", "lock_s"}, {"ExpireAt", now}}}}), want{kind: StepOther}},
		{"aj acquire outside the template", aj, fam(D{{"_id", "r"}}, D{{"$setOnInsert", D{{"ExpireAt", now}}}}), want{kind: StepOther}},
		{"aj acquire numeric _id", aj, ins(D{{"_id", 5}, {"ExpireAt", now}}), want{kind: StepOther}},
		{"aj acquire expiry a string", aj, fam(D{{"_id", "lock_r"}}, D{{"$setOnInsert", D{{"ExpireAt", "soon"}}}}), want{kind: StepOther}},
		{"aj acquire with ts only", aj, ins(D{{"_id", "lock_r"}, {"ts", now}}), want{kind: StepOther}},
		{"aj extend", aj, upd(D{{"_id", "lock_r"}}, D{{"$set", D{{"ExpireAt", now}}}}, false), want{kind: StepHolder, id: "lock_r", renew: true, expires: now}},
		{"aj extend to now", aj, upd(D{{"_id", "lock_r"}}, D{{"$currentDate", D{{"ExpireAt", true}}}}, false), want{kind: StepOther}},
		{"aj release", aj, del(D{{"_id", "lock_r"}}), want{kind: StepHolder, id: "lock_r", ends: true}},
		{"aj data write", ajData, upd(D{{"_id", "r"}}, D{{"$inc", D{{"n", 1}}}}, false), want{kind: StepHolder, id: "lock_r"}},
		{"aj data write numeric _id", ajData, upd(D{{"_id", 5}}, D{{"$inc", D{{"n", 1}}}}, false), want{kind: StepOther}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := SchemeStep(c.s, c.w)
			if got.Kind != c.want.kind || got.Ends != c.want.ends || got.ReleaseAll != c.want.all || got.Renew != c.want.renew || !c.want.anyEnd && !got.Expires.Equal(c.want.expires) {
				t.Fatalf("SchemeStep = %+v, want %+v", got, c.want)
			}
			if c.want.kind == StepOther {
				if got.Why == "" {
					t.Fatalf("StepOther without a reason")
				}
				return
			}
			if c.want.id != nil && !sameValue(got.ID, clVal(t, c.want.id)) {
				t.Fatalf("ID = %v, want %v", got.ID, c.want.id)
			}
			if (c.want.holder == nil) != (got.Holder.Type == 0) || c.want.holder != nil && !sameValue(got.Holder, clVal(t, c.want.holder)) {
				t.Fatalf("Holder = %v, want %v", got.Holder, c.want.holder)
			}
		})
	}
}

func TestRecordOf(t *testing.T) {
	s := Scheme{Type: config.SchemeLockCollection, RecordID: "lock_{_id}.x"}
	if got, ok := s.RecordOf(clVal(t, "r")); !ok || got.StringValue() != "lock_r.x" {
		t.Errorf("RecordOf(r) = %v %v", got, ok)
	}
	if _, ok := s.RecordOf(clVal(t, 5)); ok {
		t.Errorf("RecordOf(5) under a template mapped")
	}
	for id, fits := range map[string]bool{"lock_r.x": true, "lock_.x": true, "lock_r": false, "r.x": false, "lock.x": false} {
		if s.fitsRecord(clVal(t, id)) != fits {
			t.Errorf("fitsRecord(%s) = %v", id, !fits)
		}
	}
	ident := Scheme{Type: config.SchemeLockCollection, RecordID: "{_id}"}
	if got, ok := ident.RecordOf(clVal(t, 5)); !ok || got.Int32() != 5 {
		t.Errorf("identity RecordOf(5) = %v %v", got, ok)
	}
}
