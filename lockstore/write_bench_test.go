package lockstore

import (
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// BenchmarkLegacyWriteParts measures, on the embedded FerretDB, the two
// writes each change of a key makes (the claim insert, the head document
// replace) against the write a legacy writer makes ($inc of one document
// by _id): docs/BENCHMARKS.md, "Legacy writers under implicit locks",
// weighs an implicit lock's four writes by them.
//
//	go test ./lockstore -run '^$' -bench BenchmarkLegacyWriteParts -count 3
func BenchmarkLegacyWriteParts(b *testing.B) {
	s := openStore(b, testConfig(b))
	const ns = "db.parts"
	rid := ns + "/bench"
	b.Run("claimInsert", func(b *testing.B) {
		seq := int64(time.Now().UnixNano())
		for b.Loop() {
			seq++
			g := &gen{ID: genID(rid, seq), Key: rid, Seq: seq, NS: ns, Kind: kindRelease, At: time.Now(), ExpiresAt: freeExpiry}
			if ok, err := s.insert(bg, opAcquire, g); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	})
	b.Run("headReplace", func(b *testing.B) {
		var seq int64
		for b.Loop() {
			seq++
			g := &gen{ID: genID(rid, seq), Key: rid, Seq: seq, NS: ns, Kind: kindRelease, At: time.Now(), ExpiresAt: freeExpiry}
			if err := s.writeHead(bg, opAcquire, g); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("dataInc", func(b *testing.B) {
		c := s.coll.Database().Collection(fmt.Sprintf("parts_data_%d", time.Now().UnixNano()))
		if _, err := c.InsertOne(bg, bson.D{{Key: "_id", Value: 1}, {Key: "n", Value: 0}}); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := c.UpdateOne(bg, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}},
				options.Update()); err != nil {
				b.Fatal(err)
			}
		}
	})
}
