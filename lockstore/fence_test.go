package lockstore

import (
	"errors"
	"testing"
	"time"

	"github.com/lockgate/lockgate/namespace"
)

// TestTakeoverGrace: a lease that ended without a release is granted to a
// new owner only after the grace, and HeldTokens reports tokens and the
// lease left.
func TestTakeoverGrace(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	cfg := testConfig(t)
	cfg.TakeoverGrace = 2 * time.Second
	s := openStore(t, cfg, WithClock(clk))
	a, b := newOwner("a"), newOwner("b")
	id := ids(t, int32(9), "x")
	la := mustAcquire(t, s, a, "db.c", id, 10*time.Second, 0)
	tokens, left, missing, err := s.HeldTokens(bg, a, namespace.Of("db.c"), id, time.Second)
	if err != nil || len(missing) > 0 || len(tokens) != 2 || tokens[0] != la[0].Token || tokens[1] != la[1].Token {
		t.Fatalf("HeldTokens: %v %v %v, want the tokens %d %d", tokens, missing, err, la[0].Token, la[1].Token)
	}
	if left > 10*time.Second || left < 9*time.Second {
		t.Errorf("HeldTokens: lease left %v, want about 10 s", left)
	}
	clk.Advance(11 * time.Second)
	if _, err := s.Acquire(bg, b, namespace.Of("db.c"), id, time.Second, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("within the grace after the lease end: %v, want busy", err)
	}
	clk.Advance(1100 * time.Millisecond)
	lb := mustAcquire(t, s, b, "db.c", id, 10*time.Second, 0)
	if lb[0].Token <= la[0].Token {
		t.Fatal("takeover must raise the token")
	}
}
