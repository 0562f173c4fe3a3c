package guard

import (
	"context"
	"net"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// TestSchemeAcquireInTransaction: lockgate reads a document scheme's
// acquire back with its own client, which cannot see a transaction's
// writes before the commit; an acquire inside one is refused rather than
// mirrored from a read that must say "not taken".
func TestSchemeAcquireInTransaction(t *testing.T) {
	pol, err := policy.CompileWithLease(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{
		{Match: "shop.flag", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeFlag, LeaseMS: 30000}},
	}}, 30000)
	if err != nil {
		t.Fatal(err)
	}
	g := New(Options{Store: unavailableStore{}, Reserved: ReservedFor("lockgate", "locks")})
	g.SetPolicy(pol)
	for _, txn := range []bool{true, false} {
		stmt := bsoncore.NewDocumentBuilder().
			AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 7).AppendBoolean("locked", false).Build()).
			AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$set", bsoncore.NewDocumentBuilder().AppendBoolean("locked", true).Build()).Build()).Build()
		b := bsoncore.NewDocumentBuilder().AppendString("update", "flag").
			AppendDocument("lsid", bsoncore.NewDocumentBuilder().AppendBinary("id", 4, make([]byte, 16)).Build())
		if txn {
			b = b.AppendInt64("txnNumber", 1).AppendBoolean("startTransaction", true).AppendBoolean("autocommit", false)
		}
		body := b.AppendString("$db", "shop").Build()
		msg, err := wire.Parse(wire.AppendMsg(nil, 1, 0, 0, body, wire.Sequence{Identifier: "updates", Documents: []bsoncore.Document{stmt}}), wire.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		cmd, err := wire.CommandOf(msg)
		if err != nil {
			t.Fatal(err)
		}
		req := &proxy.Request{Message: msg, Command: cmd, Client: &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000",
			RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}}}
		d := g.Intercept(context.Background(), req)
		reply := bsoncore.Document(d.Reply)
		code, _ := reply.Lookup("code").AsInt64OK()
		msgText, _ := reply.Lookup("errmsg").StringValueOK()
		inTxn := code == 46 && strings.Contains(msgText, "transaction")
		if inTxn != txn {
			t.Errorf("transaction %v: decision %v, reply %s", txn, d.Action, reply)
		}
	}
}
