package lockstore

import (
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
)

// BenchmarkSessionSweepKeys: what one sweep of ended sessions costs in
// queries, over a lock collection of 1,000 keys, each with its head and
// three claims (acquire, renew, release: what compaction leaves of
// CleanupAfter's changes), the ended sessions holding none of them: the
// query of the heads alone (all a sweep asked before it read the claims
// too), of the claims alone, and both, as sweepKeys runs them. Ratios are
// read within one run:
//
//	go test ./lockstore -run '^$' -bench BenchmarkSessionSweepKeys -benchtime 20x -count 3
func BenchmarkSessionSweepKeys(b *testing.B) {
	s := openStore(b, testConfig(b))
	now, _ := s.clock.Now()
	const keys = 1000
	var heads, claims []any
	for i := range keys {
		o := newOwner("junk")
		rid := recordID("db.junk", fmt.Sprint(i))
		var g *gen
		for seq, kind := range []string{kindAcquire, kindRenew, kindRelease} {
			g = &gen{ID: genID(rid, int64(seq+1)), Key: rid, Seq: int64(seq + 1), NS: "db.junk", Kind: kind,
				Owner: sessionBinary(o.Session), Token: 1, AcquiredAt: now, ExpiresAt: now.Add(time.Hour), At: now}
			if kind == kindRelease {
				g.Owner, g.ExpiresAt = nil, freeExpiry
			}
			claims = append(claims, g)
		}
		heads = append(heads, g.asHead())
	}
	if _, err := s.coll.InsertMany(bg, heads); err != nil {
		b.Fatal(err)
	}
	if _, err := s.claims.InsertMany(bg, claims); err != nil {
		b.Fatal(err)
	}
	ended := make([]any, 0, 100)
	for range cap(ended) {
		ended = append(ended, sessionBinary(newOwner("ended").Session))
	}
	byOwner := bson.D{{Key: "owner", Value: bson.D{{Key: "$in", Value: ended}}}}
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"heads", func() error {
			_, err := s.headKeys(bg, opSweep, append(byOwner[:1:1], bson.E{Key: "head", Value: true}), map[string]bool{}, nil)
			return err
		}},
		{"claims", func() error {
			_, err := s.claimedKeys(bg, opSweep, byOwner, func(*gen) bool { return false }, map[string]bool{}, nil)
			return err
		}},
		{"both", func() error { _, err := s.sweepKeys(bg, ended, func(*gen) bool { return false }); return err }},
	} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				if err := c.run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
