package bench

import (
	"context"
	"testing"
	"time"
)

// BenchmarkEnforcedLegs is the enforce family's instant-upstream cell at
// one client in go test form, one sub-benchmark per gateway leg, for a
// differential CPU or allocation profile of the proxy around the guard.
// Run each leg alone with the same operation count, so that the setup
// (the same in both) cancels out and the difference of the two profiles,
// divided by that count, is what one enforced write adds:
//
//	go test ./bench -run '^$' -bench 'EnforcedLegs/leg=unprotected' -benchtime 40000x -cpuprofile u.prof
//	go test ./bench -run '^$' -bench 'EnforcedLegs/leg=enforced' -benchtime 40000x -cpuprofile e.prof
//	go tool pprof -top -diff_base u.prof e.prof
func BenchmarkEnforcedLegs(b *testing.B) {
	const docs = 64
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	in, err := StartInstant(docs, payload)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	f, err := startFerret()
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	gw, err := StartGateway("mongodb://"+in.Addr()+"/", f.URI(), LockedNS)
	if err != nil {
		b.Fatal(err)
	}
	defer gw.Close()
	clients := map[Leg]*Client{}
	for _, l := range []Leg{Unprotected, Enforced} {
		coll := openColl
		if l == Enforced {
			coll = lockedColl
		}
		c, err := connectTo(ctx, gw.Addr(), l, enforceDB, coll, 1)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if err := c.StartSessions(1); err != nil {
			b.Fatal(err)
		}
		clients[l] = c
	}
	enf := clients[Enforced]
	if err := lockShares(ctx, enf.client.Database(enforceDB), enf.sessions, 1, docs); err != nil {
		b.Fatal(err)
	}
	rec := NewRecorder(1, 1<<16)
	for _, l := range []Leg{Unprotected, Enforced} {
		b.Run("leg="+string(l), func(b *testing.B) {
			r, err := clients[l].RunRound(ctx, UpdateOne, 1, 0, int64(b.N), docs, rec, uint64(b.N))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(r.P50.Nanoseconds()), "p50-ns")
		})
	}
}
