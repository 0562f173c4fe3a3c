package lockstore

import (
	"math/rand/v2"
	"time"
)

// backoff is a bounded, jittered exponential backoff ("equal jitter"): the
// n-th delay is uniformly distributed in [c/2, c] where c = min(max,
// min*2^n). Jitter keeps waiters on different instances from polling in
// lockstep; the cap bounds how late a waiter notices a release made through
// another instance. Not safe for concurrent use (one per waiter).
type backoff struct {
	min, max time.Duration
	cur      time.Duration
	rand     func(n int64) int64
}

func newBackoff(min, max time.Duration) *backoff {
	if min <= 0 {
		min = DefaultMinPoll
	}
	if max < min {
		max = min
	}
	return &backoff{min: min, max: max, rand: rand.Int64N}
}

// next returns the next delay and doubles the ceiling, up to max.
func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	}
	c := b.cur
	if b.cur < b.max {
		b.cur = min(b.cur*2, b.max)
	}
	half := c / 2
	return half + time.Duration(b.rand(int64(c-half)+1))
}

// reset starts again from min, e.g. after the holder changed.
func (b *backoff) reset() { b.cur = 0 }
