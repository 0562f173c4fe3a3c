package bench

import (
	"slices"
	"time"
)

// percentile sorts samples (nanoseconds) in place and returns the
// nearest-rank p-th percentile; 0 for no samples.
func percentile(samples []int64, p int) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	if !slices.IsSorted(samples) {
		slices.Sort(samples)
	}
	rank := (p*len(samples) + 99) / 100 // ceil(p/100 * n)
	return time.Duration(samples[max(rank, 1)-1])
}

// median returns the median of xs (the mean of the middle two for an even
// count) without changing xs; 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// quartiles returns the first and third quartiles of xs (linear
// interpolation between closest ranks) without changing xs.
func quartiles(xs []float64) (q1, q3 float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	at := func(p float64) float64 {
		pos := p * float64(len(s)-1)
		i := int(pos)
		if i+1 >= len(s) {
			return s[len(s)-1]
		}
		return s[i] + (pos-float64(i))*(s[i+1]-s[i])
	}
	return at(0.25), at(0.75)
}
