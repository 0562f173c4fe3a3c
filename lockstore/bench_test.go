package lockstore

import (
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
)

// BenchmarkAcquireRelease measures an uncontended acquire+release of one
// key through one store, against the embedded FerretDB (SQLite on tmpfs).
// Each cycle is two changes of the key, each a claim insert and a head
// document write; the cached head saves the reads.
func BenchmarkAcquireRelease(b *testing.B) {
	s := openStore(b, testConfig(b))
	o := newOwner("bench")
	id := []docid.ID{rv(b, "bench")}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.Acquire(bg, o, namespace.Of("db.bench"), id, time.Minute, 0); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Release(bg, o, namespace.Of("db.bench"), id, ""); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHoldsCached measures the enforcement check for a lock taken
// through the same store: answered from the cache, no round trip.
func BenchmarkHoldsCached(b *testing.B) {
	cfg := testConfig(b)
	cfg.CacheTrust = time.Hour
	s := openStore(b, cfg)
	o := newOwner("bench")
	id := []docid.ID{rv(b, "bench")}
	if _, err := s.Acquire(bg, o, namespace.Of("db.bench"), id, 10*time.Minute, 0); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if ok, _, err := s.Holds(bg, o, namespace.Of("db.bench"), id, time.Second); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkHeldTokensCached is BenchmarkHoldsCached for what enforcement
// calls: the check plus the token and the lease left.
func BenchmarkHeldTokensCached(b *testing.B) {
	cfg := testConfig(b)
	cfg.CacheTrust = time.Hour
	s := openStore(b, cfg)
	o := newOwner("bench")
	id := []docid.ID{rv(b, "bench")}
	if _, err := s.Acquire(bg, o, namespace.Of("db.bench"), id, 10*time.Minute, 0); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if tokens, _, missing, err := s.HeldTokens(bg, o, namespace.Of("db.bench"), id, time.Second); len(tokens) != 1 || len(missing) > 0 || err != nil {
			b.Fatal(tokens, missing, err)
		}
	}
}

// BenchmarkHeldTokensIntoCached is BenchmarkHeldTokensCached the way the
// guard calls it now: into its own slice, one id, from the cache.
func BenchmarkHeldTokensIntoCached(b *testing.B) {
	cfg := testConfig(b)
	cfg.CacheTrust = time.Hour
	s := openStore(b, cfg)
	o := newOwner("bench")
	id := []docid.ID{rv(b, "bench")}
	if _, err := s.Acquire(bg, o, namespace.Of("db.bench"), id, 10*time.Minute, 0); err != nil {
		b.Fatal(err)
	}
	var tokens [1]int64
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, missing, err := s.HeldTokensInto(bg, o, namespace.Of("db.bench"), id, time.Second, tokens[:]); len(missing) > 0 || err != nil {
			b.Fatal(missing, err)
		}
	}
}
