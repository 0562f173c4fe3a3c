package lockstore

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
)

// TestHeadReadsPushdown asks the upstream (FerretDB, explain) which head
// reads it pushes down to SQLite: readHeads relies on an exact _id read
// being one, and reads by exact _id below perKeyReads keys because a $in
// is not (FerretDB v1.24 reads every head document into its own process
// and filters them there).
func TestHeadReadsPushdown(t *testing.T) {
	t.Parallel()
	s := openStore(t, testConfig(t))
	for _, rid := range []string{"db.c/01", "db.c/02"} {
		if err := s.writeHead(bg, opAcquire, &gen{ID: genID(rid, 1), Key: rid, Seq: 1, NS: "db.c"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name   string
		filter bson.D
		exact  bool
	}{
		{"exact _id", bson.D{{Key: "_id", Value: "db.c/01"}}, true},
		{"$in", bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{"db.c/01", "db.c/02"}}}}}, false},
	} {
		find := bson.D{{Key: "find", Value: s.coll.Name()}, {Key: "filter", Value: c.filter}}
		var out bson.M
		if err := s.coll.Database().RunCommand(bg, bson.D{{Key: "explain", Value: find}}).Decode(&out); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		t.Logf("%s: filterPushdown %v", c.name, out["filterPushdown"])
		if c.exact && out["filterPushdown"] != true {
			t.Errorf("%s: %v", c.name, out)
		}
	}
}

// TestHeadsBothWays: the head reads by exact _id and the one $in give
// the same heads, before and after newestAll, for keys held, released,
// force-released, never locked, collected by the janitor (a tombstone and
// no head), locked again after that, and a head moved back behind its
// claims; with a key named twice.
func TestHeadsBothWays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := newFakeClock()
	cfg := testConfig(t)
	cfg.CleanupInterval = -1 // the test runs the janitor
	s := openStore(t, cfg, WithClock(clk))
	a, b := newOwner("a"), newOwner("b")
	const ns = "db.c"
	tick := func() { clk.Advance(time.Millisecond) }

	// Collected: released, left idle for CleanupAfter, buried.
	mustAcquire(t, s, a, ns, ids(t, "gone", "again"), time.Minute, 0)
	tick()
	if n, err := s.Release(ctx, a, namespace.Of(ns), ids(t, "gone", "again"), ""); n != 2 || err != nil {
		t.Fatalf("release: %d %v", n, err)
	}
	clk.Advance(cfg.CleanupAfter + time.Minute)
	if n, err := s.CollectHeads(ctx); n != 2 || err != nil {
		t.Fatalf("CollectHeads = %d, %v", n, err)
	}
	tick()
	mustAcquire(t, s, b, ns, ids(t, "again"), time.Minute, 0) // its new life
	tick()
	mustAcquire(t, s, a, ns, ids(t, "held", "freed", "forced"), time.Minute, 0)
	tick()
	if n, err := s.Release(ctx, a, namespace.Of(ns), ids(t, "freed"), ""); n != 1 || err != nil {
		t.Fatalf("release: %d %v", n, err)
	}
	if _, err := s.ForceRelease(ctx, namespace.Of(ns), rv(t, "forced"), "test"); err != nil {
		t.Fatal(err)
	}
	// Moved back: a's first hold written over b's later ones.
	mustAcquire(t, s, a, ns, ids(t, "back"), time.Minute, 0)
	back := ks(t, ns, ids(t, "back"))
	first, err := s.claim(ctx, back, 1)
	if err != nil || first == nil {
		t.Fatalf("a's claim: %+v %v", first, err)
	}
	tick()
	if n, err := s.Release(ctx, a, namespace.Of(ns), ids(t, "back"), ""); n != 1 || err != nil {
		t.Fatalf("release: %d %v", n, err)
	}
	tick()
	mustAcquire(t, s, b, ns, ids(t, "back"), time.Minute, 0)
	if err := s.writeHead(ctx, opAcquire, first); err != nil {
		t.Fatal(err)
	}

	names := []any{"held", "freed", "forced", "never", "gone", "again", "back", "held"}
	var rids []string
	for _, n := range names {
		rids = append(rids, ks(t, ns, ids(t, n)))
	}
	byID, err := s.headsByID(ctx, rids)
	if err != nil {
		t.Fatal(err)
	}
	in, err := s.headsIn(ctx, rids)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(byID, in) {
		t.Fatalf("heads by _id and by $in differ:\n%s\n%s", showHeads(byID), showHeads(in))
	}
	// Present: held, freed, forced, again, back; never and gone have none.
	if len(byID) != 5 {
		t.Fatalf("%d heads, want 5: %s", len(byID), showHeads(byID))
	}
	if err := s.newestAll(ctx, byID); err != nil {
		t.Fatal(err)
	}
	if err := s.newestAll(ctx, in); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(byID, in) {
		t.Fatalf("newest heads by _id and by $in differ:\n%s\n%s", showHeads(byID), showHeads(in))
	}
	all, err := s.heads(ctx, rids)
	if err != nil || !reflect.DeepEqual(all, byID) {
		t.Fatalf("heads = %s, %v; want %s", showHeads(all), err, showHeads(byID))
	}
	for name, owner := range map[string]Owner{"held": a, "again": b, "back": b} {
		if h := byID[ks(t, ns, ids(t, name))]; h == nil || !h.ownedBy(owner) {
			t.Errorf("%s: head %+v, want held by %s", name, h, owner.App)
		}
	}
	for _, name := range []string{"freed", "forced"} {
		if h := byID[ks(t, ns, ids(t, name))]; h == nil || h.Owner != nil {
			t.Errorf("%s: head %+v, want free", name, h)
		}
	}
}

// showHeads prints hs in key order, each head's generation, kind and
// holder's app.
func showHeads(hs map[string]*gen) string {
	var out []string
	for rid, h := range hs {
		if h == nil {
			out = append(out, rid+": nil")
			continue
		}
		app := "-"
		if h.Owner != nil {
			app = h.OwnerApp
		}
		out = append(out, fmt.Sprintf("%s: %d %s %s", rid, h.Seq, h.Kind, app))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// headsConcurrent is headsByID with up to par reads at a time, for
// BenchmarkHeadReads only.
func (s *Store) headsConcurrent(ctx context.Context, rids []string, par int) (map[string]*gen, error) {
	got := make([]*gen, len(rids))
	errs := make([]error, len(rids))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(par, len(rids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				got[i], errs[i] = s.head(ctx, rids[i])
			}
		}()
	}
	for i := range rids {
		next <- i
	}
	close(next)
	wg.Wait()
	out := make(map[string]*gen, len(rids))
	for i, h := range got {
		if errs[i] != nil {
			return nil, errs[i]
		}
		if h != nil {
			out[h.Key] = h
		}
	}
	return out, nil
}

// BenchmarkHeadReads times the head reads of n keys on a heads collection
// of 5000 held keys: one $in ("in"), n exact _id reads one after another
// ("exact", what readHeads does up to perKeyReads keys), n exact reads
// four at a time ("exact4"), and the whole read as the store does it
// ("heads": readHeads, then newestAll, one claim read per live key up to
// perKeyReads). Each iteration runs all four, in turn, so that a change
// of the machine's load during the run weighs on each alike; the metrics
// are milliseconds per read and exact's time over in's.
//
//	go test ./lockstore -run '^$' -bench BenchmarkHeadReads -benchtime 10x
//
// Compare the metrics with each other, not across machines.
func BenchmarkHeadReads(b *testing.B) {
	s := openStore(b, testConfig(b))
	now := time.Now()
	var docs []any
	for k := range 5000 {
		rid := fmt.Sprintf("db.c/%04x", k)
		g := &gen{ID: genID(rid, 1), Key: rid, Seq: 1, NS: "db.c", Kind: kindAcquire, Owner: sessionBinary([]byte("o")),
			Token: int64(k + 1), AcquiredAt: now, ExpiresAt: now.Add(time.Hour), At: now}
		docs = append(docs, g.asHead())
	}
	if _, err := s.coll.InsertMany(bg, docs); err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{2, 8, 16, 64} {
		rids := make([]string, n)
		for i := range rids {
			rids[i] = fmt.Sprintf("db.c/%04x", i*5000/n)
		}
		reads := []struct {
			name string
			read func() (map[string]*gen, error)
		}{
			{"in", func() (map[string]*gen, error) { return s.headsIn(bg, rids) }},
			{"exact", func() (map[string]*gen, error) { return s.headsByID(bg, rids) }},
			{"exact4", func() (map[string]*gen, error) { return s.headsConcurrent(bg, rids, 4) }},
			{"heads", func() (map[string]*gen, error) { return s.heads(bg, rids) }},
		}
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			took := make([]time.Duration, len(reads))
			for i := range b.N {
				for j := range reads {
					r := (i + j) % len(reads)
					start := time.Now()
					if hs, err := reads[r].read(); len(hs) != n || err != nil {
						b.Fatal(reads[r].name, len(hs), err)
					}
					took[r] += time.Since(start)
				}
			}
			for r, d := range took {
				b.ReportMetric(float64(d.Milliseconds())/float64(b.N), reads[r].name+"-ms")
			}
			b.ReportMetric(float64(took[1])/float64(took[0]), "exact/in")
		})
	}
}
