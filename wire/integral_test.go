package wire

import (
	"math"
	"testing"

	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

func TestIntegral(t *testing.T) {
	double := func(f float64) bsoncore.Value {
		return bsoncore.Value{Type: bsontype.Double, Data: bsoncore.AppendDouble(nil, f)}
	}
	for _, tc := range []struct {
		v    bsoncore.Value
		want int64
		ok   bool
	}{
		{bsoncore.Value{Type: bsontype.Int32, Data: bsoncore.AppendInt32(nil, -7)}, -7, true},
		{bsoncore.Value{Type: bsontype.Int64, Data: bsoncore.AppendInt64(nil, 1<<40)}, 1 << 40, true},
		{double(3000), 3000, true},
		{double(1 << 53), 1 << 53, true},
		{double(1.5), 0, false},
		{double(1<<53 + 2), 0, false},
		{double(math.Inf(1)), 0, false},
		{double(math.NaN()), 0, false},
		{bsoncore.Value{Type: bsontype.String, Data: bsoncore.AppendString(nil, "5")}, 0, false},
	} {
		if got, ok := Integral(tc.v); got != tc.want || ok != tc.ok {
			t.Errorf("Integral(%v) = %d, %v; want %d, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}
