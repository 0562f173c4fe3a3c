package lockstore

import (
	"strings"
	"testing"

	"github.com/lockgate/lockgate/namespace"
)

// TestRecordIDGolden pins the lock records' _ids to what the store wrote
// when namespaces were plain strings (the values below were printed by
// that code): records already on disk must keep naming the same locks,
// however the namespace value was made.
func TestRecordIDGolden(t *testing.T) {
	for _, c := range []struct {
		ns   namespace.Namespace
		id   any
		want string
	}{
		{namespace.New("shop", "orders"), int32(1), "shop.orders/0a0131"},
		{namespace.Of("shop.orders"), int64(1), "shop.orders/0a0131"},
		{namespace.New("shop", "orders"), 1.0, "shop.orders/0a0131"},
		{namespace.New("shop", "orders"), "x", "shop.orders/0f0178"},
		{namespace.New("shop", "orders"), strings.Repeat("k", 300), "shop.orders/#78cfcdbf58cd4802ad79c0c598e0d74f1642b54dc1558c2c5ce4ec23352d81eb"},
		{namespace.New("db", "c.lock"), "a", "db.c.lock/0f0161"},
		{namespace.Of("db.c.lock"), "a", "db.c.lock/0f0161"},
	} {
		if got := recordID(c.ns, rv(t, c.id).Key()); got != c.want {
			t.Errorf("recordID(%s, %v) = %q, want %q (the record written before)", c.ns, c.id, got, c.want)
		}
	}
}
