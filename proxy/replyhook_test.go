package proxy

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// namedHook records what the proxy told it, in a log shared by the hooks
// of one test.
type namedHook struct {
	name string
	log  *[]string
}

func (h namedHook) Reply(context.Context, bsoncore.Document) bsoncore.Document {
	*h.log = append(*h.log, h.name+" reply")
	return nil
}

func (h namedHook) Abandon() { *h.log = append(*h.log, h.name+" abandon") }

// TestReplyHooksByRequest: whichever way the hooks are kept (the one
// waiting alone, or beside others), each reply reaches the hook of its own
// request and no other, a reused requestID abandons the hook it replaces,
// and closing abandons every hook still waiting, once.
func TestReplyHooksByRequest(t *testing.T) {
	type step struct {
		add   int32 // register hook "h<add>" for request add
		reply int32 // or hand over the reply to request reply
		close bool  // or abandon what remains
	}
	cases := []struct {
		name  string
		steps []step
		want  []string
	}{
		{"alone", []step{{add: 1}, {reply: 1}, {add: 2}, {reply: 2}},
			[]string{"h1 reply", "h2 reply"}},
		{"pipelined, answered in order", []step{{add: 1}, {add: 2}, {add: 3}, {reply: 1}, {reply: 2}, {reply: 3}},
			[]string{"h1 reply", "h2 reply", "h3 reply"}},
		{"pipelined, answered out of order", []step{{add: 1}, {add: 2}, {add: 3}, {reply: 3}, {reply: 1}, {add: 4}, {reply: 4}, {reply: 2}},
			[]string{"h3 reply", "h1 reply", "h4 reply", "h2 reply"}},
		{"a reply nobody waits for", []step{{add: 1}, {reply: 9}, {reply: 1}, {reply: 1}},
			[]string{"h1 reply"}},
		{"the lone request's id reused", []step{{add: 1}, {add: 1}, {reply: 1}, {reply: 1}},
			[]string{"h1 abandon", "h1 reply"}},
		{"a pipelined request's id reused", []step{{add: 1}, {add: 2}, {add: 2}, {reply: 2}, {reply: 1}},
			[]string{"h2 abandon", "h2 reply", "h1 reply"}},
		{"an id reused after the first reply", []step{{add: 1}, {add: 2}, {reply: 1}, {add: 2}, {reply: 2}, {reply: 2}},
			[]string{"h1 reply", "h2 abandon", "h2 reply"}},
		{"closed while some wait", []step{{add: 1}, {add: 2}, {add: 3}, {reply: 2}, {close: true}, {reply: 1}},
			[]string{"h2 reply", "h1 abandon", "h3 abandon"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var log []string
			closedAt := -1
			c := &conn{ctx: context.Background()}
			for _, s := range tc.steps {
				switch {
				case s.close:
					closedAt = len(log)
					c.abandonHooks()
				case s.add != 0:
					c.addHook(s.add, namedHook{name: fmt.Sprintf("h%d", s.add), log: &log})
				default:
					reply := bsoncore.NewDocumentBuilder().AppendInt32("ok", 1).Build()
					b := wire.AppendMsg(nil, 100+s.reply, s.reply, 0, reply)
					raw, err := wire.Parse(b, wire.Limits{})
					if err != nil {
						t.Fatal(err)
					}
					if out := c.hookReply(raw.Header(), b); !bytes.Equal(out, b) {
						t.Fatalf("reply to %d relayed as %x, not unchanged", s.reply, out)
					}
				}
				if got, want := c.nHooks.Load(), c.waiting(); got != want {
					t.Fatalf("nHooks %d, %d hooks kept", got, want)
				}
			}
			if closedAt >= 0 {
				// Those abandoned at close are in no particular order.
				slices.Sort(log[closedAt:])
			}
			if !slices.Equal(log, tc.want) {
				t.Fatalf("hooks told %q, want %q", log, tc.want)
			}
		})
	}
}

// waiting counts the hooks c keeps, wherever it keeps them.
func (c *conn) waiting() int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := int32(len(c.hooks))
	if c.hook != nil {
		n++
	}
	return n
}
