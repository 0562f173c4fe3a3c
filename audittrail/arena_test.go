package audittrail

import (
	"math"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/docid"
	"go.mongodb.org/mongo-driver/bson/primitive"
)

// The writer formats ids itself; its bytes must be docid.Format's, which
// every other message and the query's id match use.
func TestAppendIDMatchesFormat(t *testing.T) {
	oid, err := primitive.ObjectIDFromHex("6555aa00bb11cc22dd33ee44")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []any{int32(0), int32(-7), int32(math.MaxInt32), int64(math.MinInt64), int64(42),
		1.5, math.Inf(1), "abc", `quote " back \ tab 	 é 日 \xff`, "", oid, true, primitive.Binary{Subtype: 4, Data: make([]byte, 16)},
		primitive.D{{Key: "a", Value: int32(1)}}, strings.Repeat("x", 100)} {
		id, err := docid.Of(v)
		if err != nil {
			t.Fatalf("%v: %v", v, err)
		}
		if got, want := string(appendID([]byte("pre"), id)), "pre"+id.String(); got != want {
			t.Errorf("%T %v: got %s, want %s", v, v, got, want)
		}
	}
}

// Strings the arena handed out keep their bytes while it fills and
// moves on to new blocks.
func TestArenaStringsStay(t *testing.T) {
	var a arena
	var got []string
	var want []string
	buf := make([]byte, 0, 100)
	for i := range 5000 {
		buf = append(buf[:0], strings.Repeat(string(rune('a'+i%26)), 1+i%90)...)
		want = append(want, string(buf))
		got = append(got, a.str(buf))
		buf[0] = '!' // the caller's buffer is reused
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("string %d changed: %q, want %q", i, got[i], want[i])
		}
	}
}
