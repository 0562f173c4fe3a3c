package lockstore

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson/primitive"
)

// TestKeysIndexed: the keys the enforcement check makes are keys' keys,
// each id mapped to the key MongoDB would compare it as (1, NumberLong(1)
// and 1.0 are one), and record ids are the documented namespace/hex form
// at every length, short and hashed.
func TestKeysIndexed(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 100)
	ids := []docid.ID{rv(t, int32(1)), rv(t, "a"), rv(t, int64(1)), rv(t, 1.0), rv(t, long), rv(t, "a"),
		rv(t, primitive.NewObjectID()), rv(t, strings.Repeat("y", 300))}
	for _, n := range []int{1, 3, len(ids)} {
		for _, many := range []bool{false, true} {
			in := ids[:n]
			if many { // past the scan, into the map
				for len(in) <= 8 {
					in = append(in[:len(in):len(in)], ids[:n]...)
				}
			}
			want, err := keys(namespace.Of("db.c"), in)
			if err != nil {
				t.Fatal(err)
			}
			got, idx, err := keysIndexed(namespace.Of("db.c"), in, true)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("%d keys, want %d", len(got), len(want))
			}
			for i := range want {
				if got[i].rid != want[i].rid {
					t.Errorf("key %d: %q, want %q", i, got[i].rid, want[i].rid)
				}
			}
			for i, id := range in {
				k := i
				if idx != nil {
					k = idx[i]
				} else if len(in) > 1 {
					t.Fatal("no index for several ids")
				}
				if !got[k].id.Equal(id) {
					t.Errorf("id %d maps to key %d (%v), another id", i, k, got[k].id)
				}
			}
		}
	}
	for _, id := range ids {
		ck := id.Key()
		want := "db.c" + keySeparator + hex.EncodeToString([]byte(ck))
		if len(ck) > maxPlainKey {
			want = recordID(namespace.Of("db.c"), ck) // hashed: checked by the key tests
			if !strings.HasPrefix(want, "db.c"+keySeparator+hashKeyPrefix) {
				t.Errorf("long key %q is not hashed", want)
			}
			continue
		}
		if got := recordID(namespace.Of("db.c"), ck); got != want {
			t.Errorf("recordID %q, want %q", got, want)
		}
	}
	if _, _, err := keysIndexed(namespace.Of("db.c"), nil, true); err == nil {
		t.Error("no ids accepted")
	}
	if _, _, err := keysIndexed(namespace.Of("db.c"), []docid.ID{{}}, true); !errors.Is(err, ErrInvalidID) {
		t.Errorf("the zero ID: %v", err)
	}
}
