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
func BenchmarkEnforcedLegs(b *testing.B) { benchmarkEnforcedLegs(b, 1) }

// BenchmarkEnforcedLegs16 is the same at the enforce family's 16 clients,
// each in its own session holding the locks on its own documents: the
// machine busy, as in the family's verdict, rather than one request
// bouncing between idle cores (where a wake-up's cost dominates).
func BenchmarkEnforcedLegs16(b *testing.B) { benchmarkEnforcedLegs(b, 16) }

func benchmarkEnforcedLegs(b *testing.B, n int) {
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
		c, err := connectTo(ctx, gw.Addr(), l, enforceDB, coll, n)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if err := c.StartSessions(n); err != nil {
			b.Fatal(err)
		}
		clients[l] = c
	}
	enf := clients[Enforced]
	if err := lockShares(ctx, enf.client.Database(enforceDB), enf.sessions, n, docs); err != nil {
		b.Fatal(err)
	}
	rec := NewRecorder(n, 1<<16)
	for _, l := range []Leg{Unprotected, Enforced} {
		b.Run("leg="+string(l), func(b *testing.B) {
			r, err := clients[l].RunRound(ctx, UpdateOne, n, 0, int64(b.N), docs, rec, uint64(b.N))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(r.P50.Nanoseconds()), "p50-ns")
		})
	}
}
