package lockstore

import (
	"errors"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
)

func key(t *testing.T, v any) string {
	t.Helper()
	return recordID(namespace.Of("db.c"), rv(t, v).Key())
}

func TestRecordIDLongKeyHashed(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 1000)
	a, b := key(t, long), key(t, long+"y")
	if len(a) > 100 || a == b {
		t.Fatalf("long keys should be hashed and distinct: %q %q", a, b)
	}
	if !strings.HasPrefix(a, "db.c/#") {
		t.Fatalf("hashed key %q", a)
	}
}

func TestKeysDedupAndOrder(t *testing.T) {
	t.Parallel()
	ks, err := keys(namespace.Of("db.c"), ids(t, int32(3), 1.0, int64(1), "a"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ks) != 3 {
		t.Fatalf("got %d keys, want 3 (1 and 1.0 are one)", len(ks))
	}
	if ks[1].id.Type() != bson.TypeDouble {
		t.Fatalf("the first spelling should win, got %v", ks[1].id.Type())
	}
	ord := canonicalOrder(ks)
	for i := 1; i < len(ord); i++ {
		if ord[i-1].rid >= ord[i].rid {
			t.Fatalf("not sorted: %v", ord)
		}
	}
	if _, err := keys(namespace.Of("db.c"), nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no ids: %v", err)
	}
	if _, err := keys(namespace.Of(""), ids(t, 1)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no ns: %v", err)
	}
}
