package guard

import (
	"bytes"
	"context"
	"reflect"
	"testing"

	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// TestFlightOwnerNeverChangesInFlight: a write in flight shares its
// owner with the connection (Flight.Owner, by pointer) instead of keeping
// a copy; it must still be the owner the write was checked as while the
// connection goes on writing as others (another session, then the first
// again), and while the connection's verdict of a landed write is reused:
// the flight renews and is waited for under that owner alone.
func TestFlightOwnerNeverChangesInFlight(t *testing.T) {
	ct := newConnTest(t)
	a, b := lsidOf(1), lsidOf(2)
	ct.lockCmd(cmdAcquire, a, 7)
	ct.lockCmd(cmdAcquire, b, 8)
	f := ct.decideWrite(a, 7)
	want := *f.Owner
	want.Session = bytes.Clone(want.Session)
	if !bytes.Equal(want.Session, ct.g.owners.Session("", bytes.Repeat([]byte{1}, 16))) {
		t.Fatal("the flight is not the first session's")
	}
	same := func(step string) {
		t.Helper()
		if !reflect.DeepEqual(*f.Owner, want) {
			t.Fatalf("%s: the flight's owner changed under it: %+v, was %+v", step, *f.Owner, want)
		}
	}
	// The same session bound to a job (DESIGN §4) is another owner: the
	// connection's memo makes a new one (refused or not, the write acts
	// as it).
	stmt := bsoncore.NewDocumentBuilder().
		AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).Build()).
		AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$inc", bsoncore.NewDocumentBuilder().AppendInt32("n", 1).Build()).Build()).
		Build()
	ct.do(bsoncore.NewDocumentBuilder().AppendString("update", "locked").AppendDocument("lsid", a).
		AppendString("comment", "lockgate:job-7").AppendString("$db", "db").Build(),
		wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}})
	same("the first session, bound")
	ct.write(a, 7)
	same("the first session, unbound again")
	other := ct.decideWrite(b, 8)
	same("another session's write")
	other.Reply(context.Background(), nil) // lands: its verdict goes back to the connection
	if !ct.write(b, 8) {
		t.Fatal("the other session's write was refused")
	}
	same("the connection's reused verdict")
	ct.lockCmd(cmdAcquire, a, 9)
	ct.write(a, 9)
	same("the first session again")
	if !ct.inFlight(7) {
		t.Fatal("the flight is not tracked")
	}
	f.Reply(context.Background(), nil)
	if ct.inFlight(7) {
		t.Fatal("the flight did not land")
	}
	var zero lockstore.Owner
	if reflect.DeepEqual(want, zero) {
		t.Fatal("no owner: the test proves nothing")
	}
}
