package metricset

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type metrics struct {
	Set
	hits   prometheus.Counter
	byKind *prometheus.CounterVec
	other  map[string]int
}

func TestSetCollectsWhatWasAdded(t *testing.T) {
	m := &metrics{}
	m.hits = Add(&m.Set, prometheus.NewCounter(prometheus.CounterOpts{Name: "x_hits_total", Help: "h"}))
	m.byKind = Add(&m.Set, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_kinds_total", Help: "k"}, []string{"kind"}))
	m.hits.Add(2)
	m.byKind.WithLabelValues("a").Inc()
	reg := prometheus.NewRegistry()
	if err := reg.Register(m); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 2 {
		t.Fatalf("gathered %d series (%v), want 2", n, err)
	}
	if got := testutil.ToFloat64(m.hits); got != 2 {
		t.Fatalf("hits %v", got)
	}
	if n := CollectorFields(m); n != len(m.Set) {
		t.Fatalf("CollectorFields %d, set %d", n, len(m.Set))
	}
	// A collector created without Add is caught.
	var bare metrics
	bare.hits = prometheus.NewCounter(prometheus.CounterOpts{Name: "y", Help: "y"})
	if CollectorFields(&bare) == len(bare.Set) {
		t.Fatal("a collector outside the set went unnoticed")
	}
}
