package guard

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"sync"

	"go.mongodb.org/mongo-driver/bson"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockgate/lockgate/audittrail"
	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard/enforce"
)

// TestSchemeDecisionSaysTheLockState: an allowed scheme write's decision
// line (and its audit trail record) says what state of the scheme lock
// it was decided from, so that an operator reading the log tells a
// takeover of an abandoned lock from a holder's own write, from the
// removal of an abandoned record, and from an acquire answered busy.
// Before, every such line said only "allow".
func TestSchemeDecisionSaysTheLockState(t *testing.T) {
	db := "sstate_" + time.Now().Format("150405.000000")[7:]
	pol := config.Policy{Default: config.ModeOff, MaxCandidates: 50, LeaseMarginMS: 100,
		Namespaces: []config.NamespaceRule{
			{Match: db + "h.*", Mode: config.ModeEnforce,
				Scheme: &config.Scheme{Type: config.SchemeHolderFields, Field: "LockId", TimeField: "LockTime", LeaseMS: 60000}},
			{Match: db + ".*", Mode: config.ModeEnforce,
				Scheme: &config.Scheme{Type: config.SchemeLockCollection, LeaseMS: 60000}},
		}}
	core, logs := observer.New(zap.InfoLevel)
	trail := &trailEvents{}
	st := startStackWith(t, stackOptions{policy: pol, logger: zap.New(core), trail: trail})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := connect(t, st.uri, "a").Database(db).Collection("c.lock")
	b := connect(t, st.uri, "b").Database(db).Collection("c.lock")
	direct := connect(t, upstreamURI(t), "direct")
	old := time.Now().Add(-2 * time.Minute)
	for _, id := range []int32{2, 4} {
		if _, err := direct.Database(db).Collection("c.lock").InsertOne(ctx, bson.D{{"_id", id}, {"ts", old}, {"aid", "gone"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := direct.Database(db+"h").Collection("d").InsertOne(ctx, bson.D{{"_id", 1}, {"LockId", "X"}, {"LockTime", old}}); err != nil {
		t.Fatal(err)
	}
	must := func(step string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	_, err := a.InsertOne(ctx, bson.D{{"_id", int32(1)}, {"ts", time.Now()}, {"aid", "A"}})
	must("acquire of a free record", err)
	_, err = a.UpdateOne(ctx, bson.D{{"_id", int32(1)}}, bson.D{{"$set", bson.D{{"ts", time.Now()}}}})
	must("refresh", err)
	if _, err := b.InsertOne(ctx, bson.D{{"_id", int32(1)}, {"ts", time.Now()}, {"aid", "B"}}); err == nil {
		t.Fatal("b acquired a's record")
	}
	_, err = b.DeleteOne(ctx, bson.D{{"_id", int32(2)}})
	must("delete of an abandoned record", err)
	_, err = b.DeleteOne(ctx, bson.D{{"_id", int32(3)}})
	must("delete of an absent record", err)
	_, err = b.InsertOne(ctx, bson.D{{"_id", int32(4)}, {"ts", time.Now()}, {"aid", "B"}})
	must("takeover of an abandoned record", err)
	_, err = a.DeleteOne(ctx, bson.D{{"_id", int32(1)}})
	must("release", err)
	hf := connect(t, st.uri, "y").Database(db + "h").Collection("d")
	r, err := hf.UpdateOne(ctx, bson.D{{"_id", 1}, {"$or", bson.A{bson.D{{"LockId", nil}}, bson.D{{"LockTime", bson.D{{"$lt", time.Now().Add(-time.Minute)}}}}}}},
		bson.D{{"$set", bson.D{{"LockId", "Y"}, {"LockTime", time.Now()}}}})
	must("holderFields takeover", err)
	if r.ModifiedCount != 1 {
		t.Fatalf("holderFields takeover modified %d", r.ModifiedCount)
	}

	want := []string{"free", "held", "busy", "abandoned", "absent", "takeover", "held", "takeover"}
	var got []string
	for _, e := range logs.FilterMessage("decision").All() {
		m := e.ContextMap()
		got = append(got, fmt.Sprint(m["lockState"]))
		if m["decision"] != enforce.DecisionAllow {
			t.Errorf("decision line %v: want allow", m)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decision lines' lockState %v, want %v", got, want)
	}
	got = nil
	trail.mu.Lock()
	for _, ev := range trail.got {
		got = append(got, ev.Detail)
	}
	trail.mu.Unlock()
	for i := range want {
		want[i] = "scheme lock state: " + want[i]
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("audit trail details %q, want %q", got, want)
	}
}

// trailEvents keeps the audit trail's records.
type trailEvents struct {
	mu  sync.Mutex
	got []audittrail.Event
}

func (e *trailEvents) Append(ev audittrail.Event) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, ev)
	return true
}

func (e *trailEvents) Commit(_ context.Context, ev audittrail.Event) error {
	e.Append(ev)
	return nil
}
