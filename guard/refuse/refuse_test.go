package refuse

import (
	"os"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

// TestLeaseEndNeverPrintsZeroTime: a refusal for an absent or released
// lease used to say "until 1970-01-01" (issue 12).
func TestLeaseEndNeverPrintsZeroTime(t *testing.T) {
	for _, tm := range []time.Time{{}, time.Unix(0, 0)} {
		if s := leaseEnd(tm); strings.Contains(s, "1970") || strings.Contains(s, "0001") {
			t.Errorf("leaseEnd(%v) = %q", tm, s)
		}
	}
	if s := leaseEnd(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)); s != "until 2030-01-02T03:04:05Z" {
		t.Errorf("leaseEnd of a real lease = %q", s)
	}
	he := &lockstore.HeldError{NS: namespace.Of("a.b"), ID: lockstoretest.ID(int32(1)), Timeout: true}
	if s := he.Error(); strings.Contains(s, "1970") || strings.Contains(s, "0001") {
		t.Errorf("HeldError without a lease: %q", s)
	}
}

// TestDocumentShape: the reply is what docs/ERRORS.md promises users who
// match on it: the MongoDB error fields and lockgate's detail, with a long
// id list cut to its first ids and their count.
func TestDocumentShape(t *testing.T) {
	ids := make([]docid.ID, maxReplyIDs+5)
	for i := range ids {
		ids[i] = lockstoretest.ID(int32(i))
	}
	h := lockstore.Holder{App: "shop", SessionPrefix: "ab12", ExpiresAt: time.UnixMilli(1_900_000_000_000), Implicit: "update"}
	e := &Error{Code: mongoerr.LockBusy, Reason: ReasonHeld, Msg: "held", NS: "a.b", IDs: ids, Holder: &h}
	var got bson.M
	if err := bson.Unmarshal(e.LateReply(), &got); err != nil {
		t.Fatal(err)
	}
	if got["ok"] != 0.0 || got["errmsg"] != "held" || got["code"] != int32(mongoerr.LockBusy) || got["codeName"] != mongoerr.LockBusy.Name() {
		t.Errorf("reply %v", got)
	}
	d := got["lockgate"].(bson.M)
	if d["reason"] != ReasonHeld || d["ns"] != "a.b" || len(d["ids"].(bson.A)) != maxReplyIDs || d["idsTotal"] != int32(len(ids)) {
		t.Errorf("lockgate detail %v", d)
	}
	if hd := d["holder"].(bson.M); hd["app"] != "shop" || hd["tag"] != "ab12" || hd["implicit"] != true || hd["command"] != "update" {
		t.Errorf("holder %v", hd)
	}
	if !strings.Contains(IDsString(ids), "... (105 in all)") {
		t.Errorf("IDsString of %d ids: %s", len(ids), IDsString(ids))
	}
}
