package proxy

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/wire"
)

// Leave keeps a maxTimeMS already in the message only when it surely
// bounds the run to what is left: a double with a fraction does not (a
// server may round 4.5 up past 4 ms, or down to 0, no limit), so it is
// overwritten with the whole milliseconds left, as a larger value is.
func TestLeaveReplacesAFractionalMaxTime(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		own  float64
		left time.Duration
		want float64
	}{
		{4.5, 4900 * time.Microsecond, 4},
		{0.5, 4900 * time.Microsecond, 4},
		{4, 4900 * time.Microsecond, 4},
		{3, 4900 * time.Microsecond, 3},
		{9, 4900 * time.Microsecond, 4},
	} {
		for _, flags := range []wire.MsgFlags{0, wire.ChecksumPresent} {
			body := bsoncore.NewDocumentBuilder().AppendString("update", "orders").
				AppendDouble("maxTimeMS", tc.own).AppendString("$db", "shop").Build()
			b := wire.AppendMsg(nil, 1, 0, flags, body)
			at, ok := wire.LocateCommandNumber(b, "maxTimeMS")
			if !ok {
				t.Fatal("maxTimeMS not located")
			}
			d := Decision{Action: Forward, Deadline: now.Add(tc.left), MaxTime: at}
			if !d.Leave(b, now) {
				t.Fatalf("maxTimeMS %v with %v left: refused as late", tc.own, tc.left)
			}
			m, err := wire.Parse(b, wire.Limits{})
			if err != nil {
				t.Fatalf("maxTimeMS %v: the patched message does not parse: %v", tc.own, err)
			}
			if got := m.(*wire.OpMsg).Body.Lookup("maxTimeMS").Double(); got != tc.want {
				t.Errorf("maxTimeMS %v with %v left (flags %v): sent %v, want %v", tc.own, tc.left, flags, got, tc.want)
			}
		}
	}
}
