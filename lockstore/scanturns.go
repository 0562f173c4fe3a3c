package lockstore

import (
	"context"
	"sync"
	"sync/atomic"
)

// releaseAllScans bounds the release-alls that look for their keys at once,
// store-wide: each is a query of the heads by owner and one of the claims,
// both scans on FerretDB, which any client may ask for (releaseLock
// without ids). The guard's throttle bounds what one connection asks
// (guard/lockcmd releaseAllCost); this bounds what many connections ask
// together, so that their scans cannot take the store client's pool from
// the acquires, lock checks and releases that read by _id.
const releaseAllScans = 4

// scanTurns hands out the turns of releaseAllScans. Its zero value is
// ready to use.
type scanTurns struct {
	once    sync.Once
	ch      chan struct{}
	waiting atomic.Int32 // callers waiting for a turn (tests wait on it)
	// testHookHeld, when set, runs while a turn is held.
	testHookHeld func()
}

// take waits for a turn, first come first served as the runtime wakes
// channel senders; ctx ending first is its error.
func (t *scanTurns) take(ctx context.Context) error {
	t.once.Do(func() { t.ch = make(chan struct{}, releaseAllScans) })
	select {
	case t.ch <- struct{}{}:
	default:
		t.waiting.Add(1)
		defer t.waiting.Add(-1)
		select {
		case t.ch <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if t.testHookHeld != nil {
		t.testHookHeld()
	}
	return nil
}

// done ends a turn taken.
func (t *scanTurns) done() { <-t.ch }
