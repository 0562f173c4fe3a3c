package proxy

import (
	"context"
	"testing"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// landedHook is a hook like the guard's flight: told only that the reply
// arrived.
type landedHook struct{ n *int }

func (h landedHook) Reply(context.Context, bsoncore.Document) bsoncore.Document { *h.n++; return nil }
func (h landedHook) Abandon()                                                   {}
func (h landedHook) NeedsBody() bool                                            { return false }

// BenchmarkReplyHookAlone is the proxy's share of an enforced write's
// bookkeeping of its reply hook: registered by the client pump, taken and
// run by the upstream pump, one request at a time as a driver sends them.
func BenchmarkReplyHookAlone(b *testing.B) {
	c := &conn{ctx: context.Background()}
	reply := wire.AppendMsg(nil, 2, 1, 0, bsoncore.NewDocumentBuilder().AppendInt32("ok", 1).Build())
	raw, err := wire.Parse(reply, wire.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	h := raw.Header()
	var n int
	hook := landedHook{&n}
	b.ReportAllocs()
	for range b.N {
		c.addHook(1, hook)
		c.hookReply(h, reply)
	}
	if n != b.N {
		b.Fatalf("%d replies landed, want %d", n, b.N)
	}
}
