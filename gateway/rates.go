package gateway

import (
	"context"
	"sort"
	"sync"
	"time"
)

// rateMinutes is how many whole minutes of decisions the console shows.
const rateMinutes = 10

// rateKey is one lockgate_decisions_total series.
type rateKey struct{ rule, decision, reason string }

// decisionRates turns the decision counters, which only ever grow, into
// counts per minute for the last rateMinutes minutes: an operator asks
// "what is refused now", which totals since start cannot answer once the
// process has run for a week. It samples the counters (observe) and puts
// each increase into the minute of the sample that saw it, so a count
// lands at most one sampling interval late. The ring holds one bucket per
// minute and nothing older.
//
// now is injected so that tests step through minutes; read returns the
// counters' current totals. Safe for concurrent use.
type decisionRates struct {
	now  func() time.Time
	read func() map[rateKey]float64

	mu      sync.Mutex
	last    map[rateKey]float64 // totals at the previous sample; nil before the first
	buckets [rateMinutes]rateBucket
}

type rateBucket struct {
	minute int64 // Unix minutes; which minute the bucket holds now
	counts map[rateKey]float64
}

func newDecisionRates(now func() time.Time, read func() map[rateKey]float64) *decisionRates {
	return &decisionRates{now: now, read: read}
}

// observe samples the counters. The first sample is the baseline: what was
// counted before it (before lockgate started serving, in practice
// nothing) is in no minute.
func (d *decisionRates) observe() {
	// Read under the lock: two samples applied out of order would count
	// an increase twice.
	d.mu.Lock()
	defer d.mu.Unlock()
	totals := d.read()
	m := d.now().Unix() / 60
	if d.last != nil {
		for k, v := range totals {
			// A series missing from the last sample had not been
			// counted yet: it was zero.
			if inc := v - d.last[k]; inc > 0 {
				b := &d.buckets[m%rateMinutes]
				if b.minute != m || b.counts == nil {
					*b = rateBucket{minute: m, counts: map[rateKey]float64{}}
				}
				b.counts[k] += inc
			}
		}
	}
	d.last = totals
}

// rateSeries is one series' counts per minute, oldest first, and its
// total since start.
type rateSeries struct {
	Rule     string    `json:"rule"`
	Decision string    `json:"decision"`
	Reason   string    `json:"reason"`
	PerMin   []float64 `json:"perMinute"`
	Total    float64   `json:"total"`
}

// rateView is what the console shows: the start of each minute (UTC,
// oldest first, the current, partial minute last) and every series that
// ever counted, those with no decision in the window included, so that
// the totals since start stay on the page.
type rateView struct {
	Minutes []time.Time  `json:"minutes"`
	Series  []rateSeries `json:"series"`
}

func (d *decisionRates) view() rateView {
	m := d.now().Unix() / 60
	d.mu.Lock()
	defer d.mu.Unlock()
	v := rateView{Minutes: make([]time.Time, rateMinutes), Series: []rateSeries{}}
	for i := range rateMinutes {
		v.Minutes[i] = time.Unix((m-rateMinutes+1+int64(i))*60, 0).UTC()
	}
	idx := map[rateKey]int{}
	series := func(k rateKey) *rateSeries {
		i, ok := idx[k]
		if !ok {
			i = len(v.Series)
			idx[k] = i
			v.Series = append(v.Series, rateSeries{Rule: k.rule, Decision: k.decision, Reason: k.reason, PerMin: make([]float64, rateMinutes)})
		}
		return &v.Series[i]
	}
	for k, total := range d.last {
		// Counters are created at zero for every reason: a series
		// that never counted anything is noise on the page.
		if total > 0 {
			series(k).Total = total
		}
	}
	for i := range rateMinutes {
		want := m - rateMinutes + 1 + int64(i)
		b := d.buckets[want%rateMinutes]
		if b.minute != want {
			continue // an older minute's bucket, or none
		}
		for k, n := range b.counts {
			series(k).PerMin[i] = n
		}
	}
	sort.Slice(v.Series, func(i, j int) bool {
		a, b := v.Series[i], v.Series[j]
		if a.Rule != b.Rule {
			return a.Rule < b.Rule
		}
		if a.Decision != b.Decision {
			return a.Decision < b.Decision
		}
		return a.Reason < b.Reason
	})
	return v
}

// run samples every interval until ctx ends.
func (d *decisionRates) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		d.observe()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
