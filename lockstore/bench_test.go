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

// BenchmarkHeldTokenMemo is BenchmarkHeldTokensIntoCached answered from
// the caller's memo, as the guard asks on a document's repeated writes:
// no key built, no mutex, no map; the caller's reading of the clock (the
// guard's decision reads it anyway) stands for the check's own.
func BenchmarkHeldTokenMemo(b *testing.B) {
	cfg := testConfig(b)
	cfg.CacheTrust = time.Hour
	s := openStore(b, cfg)
	o := newOwner("bench")
	id := rv(b, "bench")
	ns := namespace.Of("db.bench")
	if _, err := s.Acquire(bg, o, ns, []docid.ID{id}, 10*time.Minute, 0); err != nil {
		b.Fatal(err)
	}
	var memos HeldMemos
	if _, _, ok := s.HeldTokenMemo(&memos, &o, ns, &id, time.Second, time.Time{}); !ok {
		b.Fatal("not held")
	}
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, _, ok := s.HeldTokenMemo(&memos, &o, ns, &id, time.Second, now); !ok {
			b.Fatal("not held")
		}
	}
}
