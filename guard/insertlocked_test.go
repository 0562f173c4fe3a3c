package guard

import (
	"encoding/binary"
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/wire"
)

// TestNoInsertOfALockedIDInAnyForm is issue 16's third path in every form
// an insert arrives in, on the embedded upstream with the default rule
// (no inserts: key): another session holds the locks on _id 7 and "k",
// documents that do not exist yet (lock, then upsert). An intruder's
// insert of either, as another numeric type of 7, in the middle of a batch,
// as an upsert by update, replace, findAndModify or $setOnInsert, through
// the bulkWrite admin command or a legacy OP_INSERT, is refused and nothing
// is written, not even the batch's other documents. Under inserts: allow
// (the previous default) the same insert goes through; the holder's own
// upsert creates the document.
func TestNoInsertOfALockedIDInAnyForm(t *testing.T) {
	coll, pol := protected(t, 1)
	pol.Namespaces = append(pol.Namespaces, config.NamespaceRule{Match: "shop." + coll + "_allow", Mode: config.ModeEnforce, Inserts: config.InsertsAllow})
	st := startStackWith(t, stackOptions{memStore: decisionStore(), policy: pol})
	holder, intruder := connect(t, st.uri, "holder"), connect(t, st.uri, "intruder")
	hs, is := session(t, holder), session(t, intruder)
	acquire(t, holder, hs, coll, 7, "k")
	acquire(t, holder, hs, coll+"_allow", 7)
	before := snapshot(t, coll)

	c := intruder.Database("shop").Collection(coll)
	ctx := inSession(is)
	set := bson.D{{"$set", bson.D{{"by", "intruder"}}}}
	for _, f := range []struct {
		name string
		run  func() error
	}{
		{"insert", func() error { _, err := c.InsertOne(ctx, bson.D{{"_id", 7}}); return err }},
		{"insert as a double", func() error { _, err := c.InsertOne(ctx, bson.D{{"_id", 7.0}}); return err }},
		{"insert as a long", func() error { _, err := c.InsertOne(ctx, bson.D{{"_id", int64(7)}}); return err }},
		{"insert of a string id", func() error { _, err := c.InsertOne(ctx, bson.D{{"_id", "k"}}); return err }},
		{"insert in the middle of a batch", func() error {
			_, err := c.InsertMany(ctx, []any{bson.D{{"_id", 100}}, bson.D{{"_id", 7}}, bson.D{{"_id", 101}}})
			return err
		}},
		{"upsert by update", func() error {
			_, err := c.UpdateOne(ctx, bson.D{{"_id", 7}}, set, options.Update().SetUpsert(true))
			return err
		}},
		{"upsert by $setOnInsert", func() error {
			_, err := c.UpdateOne(ctx, bson.D{{"by", "nobody"}}, bson.D{{"$setOnInsert", bson.D{{"_id", 7}}}}, options.Update().SetUpsert(true))
			return err
		}},
		{"upsert by replace", func() error {
			_, err := c.ReplaceOne(ctx, bson.D{{"_id", "k"}}, bson.D{{"by", "intruder"}}, options.Replace().SetUpsert(true))
			return err
		}},
		{"upsert by findAndModify", func() error {
			return c.FindOneAndUpdate(ctx, bson.D{{"_id", 7}}, set, options.FindOneAndUpdate().SetUpsert(true)).Err()
		}},
		{"bulkWrite admin command", func() error {
			return intruder.Database("admin").RunCommand(ctx, bson.D{{"bulkWrite", 1},
				{"ops", bson.A{bson.D{{"insert", 0}, {"document", bson.D{{"_id", 7}}}}}},
				{"nsInfo", bson.A{bson.D{{"ns", "shop." + coll}}}}}).Err()
		}},
	} {
		lockBusy(t, f.run(), "")
		if after := snapshot(t, coll); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("%s: the collection changed:\nbefore %v\nafter  %v", f.name, before, after)
		}
	}

	// OP_INSERT carries no session: no reply to refuse with, so the
	// connection is closed, and nothing is written.
	a := &attacker{t: t, addr: st.addr}
	b := wire.Header{RequestID: 1, OpCode: wire.OpCodeInsert}.Append(nil)
	b = binary.LittleEndian.AppendUint32(b, 0) // flags
	b = append(append(b, "shop."+coll...), 0)
	b = append(b, a.doc(bson.D{{"_id", 7}})...)
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	if got := a.send(b); !got.closed {
		t.Errorf("OP_INSERT of a locked _id: %v, want the connection closed", got.body)
	}
	if after := snapshot(t, coll); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("OP_INSERT: the collection changed:\nbefore %v\nafter  %v", before, after)
	}

	// Without the check, the intruder creates the document the holder
	// locked.
	if _, err := intruder.Database("shop").Collection(coll+"_allow").InsertOne(ctx, bson.D{{"_id", 7}, {"by", "intruder"}}); err != nil {
		t.Errorf("insert under inserts: allow: %v", err)
	}
	// The holder's lock-then-upsert creates it.
	res, err := holder.Database("shop").Collection(coll).UpdateOne(inSession(hs), bson.D{{"_id", 7}}, bson.D{{"$set", bson.D{{"by", "holder"}}}}, options.Update().SetUpsert(true))
	if err != nil || res.UpsertedCount != 1 {
		t.Fatalf("the holder's upsert: %+v, %v", res, err)
	}
	var got bson.M
	if err := holder.Database("shop").Collection(coll).FindOne(inSession(hs), bson.D{{"_id", 7}}).Decode(&got); err != nil || got["by"] != "holder" {
		t.Errorf("the holder's document: %v, %v", got, err)
	}
}
