package gateway

import (
	"testing"
	"time"
)

// The console's decision rates: counts land in the minute they were
// sampled in, a minute with none shows zero, and a minute that slid out of
// the window is gone while the total since start stays (issue 26, item
// 10). The clock is stepped, not waited for.
func TestDecisionRatesPerMinute(t *testing.T) {
	now := time.Date(2026, 11, 26, 20, 0, 10, 0, time.UTC)
	totals := map[rateKey]float64{}
	read := func() map[rateKey]float64 {
		c := make(map[rateKey]float64, len(totals))
		for k, v := range totals {
			c[k] = v
		}
		return c
	}
	d := newDecisionRates(func() time.Time { return now }, read)
	reject := rateKey{"shop.orders", "reject", "not_locked"}
	allow := rateKey{"shop.orders", "allow", ""}

	totals[reject] = 4 // counted before the first sample: in no minute
	d.observe()
	totals[reject] += 3
	totals[allow] = 2
	d.observe()
	now = now.Add(2 * time.Minute) // 20:02: nothing in 20:01
	totals[reject]++
	d.observe()

	if v := d.view(); len(v.Minutes) != rateMinutes || !v.Minutes[rateMinutes-1].Equal(time.Date(2026, 11, 26, 20, 2, 0, 0, time.UTC)) {
		t.Fatalf("minutes %v, want %d ending with 20:02", v.Minutes, rateMinutes)
	}
	perMin := func(k rateKey) ([]float64, float64) {
		t.Helper()
		v := d.view()
		for _, s := range v.Series {
			if (rateKey{s.Rule, s.Decision, s.Reason}) == k {
				return s.PerMin, s.Total
			}
		}
		t.Fatalf("no series %v in %+v", k, v.Series)
		return nil, 0
	}
	got, total := perMin(reject)
	if last := got[rateMinutes-3:]; last[0] != 3 || last[1] != 0 || last[2] != 1 || total != 8 {
		t.Errorf("rejects per minute %v (total %v), want ..., 3, 0, 1 and 8 in all", got, total)
	}
	if got, _ := perMin(allow); got[rateMinutes-3] != 2 {
		t.Errorf("allows per minute %v, want 2 in 20:00", got)
	}

	// rateMinutes later the 20:00 bucket is reused for a new minute: its
	// old counts must not show again.
	now = now.Add(time.Duration(rateMinutes-2) * time.Minute)
	totals[reject] += 5
	d.observe()
	got, total = perMin(reject)
	for i, n := range got[:rateMinutes-1] {
		if n != 0 && i != rateMinutes-1-(rateMinutes-2) {
			t.Errorf("minute %d shows %v, want 0 (only 20:02's 1 and now's 5 are in the window): %v", i, n, got)
		}
	}
	if got[rateMinutes-1] != 5 || total != 13 {
		t.Errorf("now %v (total %v), want 5 and 13", got, total)
	}
	if got, _ := perMin(allow); sum(got) != 0 {
		t.Errorf("allows %v: 20:00 has slid out of the window", got)
	}
}

func sum(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s
}
