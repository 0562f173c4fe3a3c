package guard

import (
	"context"
	"errors"
	"testing"

	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/lockstoretest"
	"github.com/lockgate/lockgate/namespace"
)

// TestHeldMemoNeverStale: a connection's memo of its latest lock check
// (heldFromMemo) answers its next write of the same document only while
// the lock store is unchanged: a release, a session's release, an outage
// or a takeover through the store itself, not through this guard, refuses
// the very next write.
func TestHeldMemoNeverStale(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(c *connTest, o lockstore.Owner)
	}{
		{"release", func(c *connTest, o lockstore.Owner) {
			if n, err := c.store.Release(context.Background(), o, namespace.Of("db.locked"), lockstoretest.IDs(int32(7)), ""); n != 1 || err != nil {
				c.t.Fatalf("release: %d %v", n, err)
			}
		}},
		{"session released", func(c *connTest, o lockstore.Owner) {
			if _, err := c.store.ReleaseSession(context.Background(), o.Session); err != nil {
				c.t.Fatal(err)
			}
		}},
		{"outage", func(c *connTest, o lockstore.Owner) {
			c.store.SetUnavailable(errors.New("test outage"))
		}},
		{"taken over", func(c *connTest, o lockstore.Owner) {
			if _, err := c.store.ReleaseSession(context.Background(), o.Session); err != nil {
				c.t.Fatal(err)
			}
			c.lockCmd(cmdAcquire, lsidOf(2), 7)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ct := newConnTest(t)
			a := lsidOf(1)
			ct.lockCmd(cmdAcquire, a, 7)
			f := ct.decideWrite(a, 7)
			o := *f.Owner
			f.Reply(context.Background(), nil)
			if !ct.write(a, 7) {
				t.Fatal("the holder's second write was refused")
			}
			c.change(ct, o)
			if ct.write(a, 7) {
				t.Fatal("a write was let through on a stale memo after the change")
			}
		})
	}
}

// TestHeldMemoPerDocument: the memos of a connection's few documents
// (one each) answer their own document only: releasing one through the
// store refuses its next write and leaves the other's allowed.
func TestHeldMemoPerDocument(t *testing.T) {
	c := newConnTest(t)
	a := lsidOf(1)
	c.lockCmd(cmdAcquire, a, 7)
	c.lockCmd(cmdAcquire, a, 8)
	for range 3 {
		for _, id := range []int32{7, 8} {
			if !c.write(a, id) {
				t.Fatalf("the holder's write of %d was refused", id)
			}
		}
	}
	f := c.decideWrite(a, 7)
	o := *f.Owner
	f.Reply(context.Background(), nil)
	if n, err := c.store.Release(context.Background(), o, namespace.Of("db.locked"), lockstoretest.IDs(int32(7)), ""); n != 1 || err != nil {
		t.Fatalf("release: %d %v", n, err)
	}
	if !c.write(a, 8) {
		t.Fatal("the write of the document still locked was refused")
	}
	if c.write(a, 7) {
		t.Fatal("the write of the released document was let through")
	}
}
