package guard

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/bson"

	"github.com/lockgate/lockgate/config"
)

// TestRefuseLocksOnMissingCollection: under a rule with
// refuseLocksOnMissingCollection, acquireLock in a collection that does not
// exist is refused with NamespaceNotFound and a message that names the rule
// (issue 9); once the collection exists the same lock is granted. Under a
// rule without the option the lock is granted with a warning.
func TestRefuseLocksOnMissingCollection(t *testing.T) {
	n := collSeq.Add(1)
	strict, lax := fmt.Sprintf("strictdb_%d", n), fmt.Sprintf("laxdb_%d", n)
	st := startStackWith(t, stackOptions{policy: config.Policy{
		Default: config.ModeOff,
		Namespaces: []config.NamespaceRule{
			{Match: strict + ".*", Mode: config.ModeEnforce, RefuseLocksOnMissingCollection: true},
			{Match: lax + ".*", Mode: config.ModeEnforce},
		},
	}})
	c := connect(t, st.uri, "missing")
	s := session(t, c)
	ctx := inSession(s)

	var reply bson.M
	err := c.Database(strict).RunCommand(ctx, bson.D{{"acquireLock", "ordres"}, {"ids", bson.A{1}}}).Decode(&reply)
	ce := commandError(t, err)
	if ce.Code != 26 || ce.Name != "NamespaceNotFound" ||
		!strings.Contains(ce.Message, "the collection "+strict+".ordres does not exist") || !strings.Contains(ce.Message, `rule "`+strict+`.*"`) {
		t.Fatalf("acquireLock in a missing collection under the rule: %v, want 26 NamespaceNotFound naming the collection and the rule", err)
	}
	if _, err := c.Database(strict).Collection("orders").InsertOne(context.Background(), bson.D{{"_id", 1}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Database(strict).RunCommand(ctx, bson.D{{"acquireLock", "orders"}, {"ids", bson.A{1}}}).Decode(&reply); err != nil {
		t.Fatalf("acquireLock in an existing collection under the rule: %v", err)
	}
	if w, ok := reply["warnings"]; ok {
		t.Errorf("acquireLock in an existing collection: warnings %v", w)
	}

	if err := c.Database(lax).RunCommand(ctx, bson.D{{"acquireLock", "ordres"}, {"ids", bson.A{1}}}).Decode(&reply); err != nil {
		t.Fatalf("acquireLock in a missing collection without the option: %v, want it granted", err)
	}
	if !strings.Contains(fmt.Sprint(reply["warnings"]), lax+".ordres does not exist") {
		t.Errorf("acquireLock in a missing collection without the option: warnings %v, want one saying it does not exist", reply["warnings"])
	}
}
