package lockstore

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockgate/lockgate/namespace"
)

// TestFailedAcquireLeavesNoHolder: an acquire whose grant was written but
// reported failed (its head document write failed after its claim landed,
// or the claim landed and its reply was lost) fails, and must leave no
// holder behind: the caller was told it holds nothing and will not
// release anything. Left standing, the claim made every later acquire of
// the key answer "held by legacy-batch" (an owner that is gone) until its
// lease ended, the refusal once seen in a guard test. Both keys of a
// two-key acquire are covered: the first (rolled back as a key the
// attempt took) and the one whose write failed.
func TestFailedAcquireLeavesNoHolder(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	s := openStore(t, cfg)
	for _, what := range []string{"head", "claim"} {
		for _, failing := range []int{1, 2} {
			t.Run(what+"/key"+string(rune('0'+failing)), func(t *testing.T) {
				ns := "db.fail_" + what + string(rune('0'+failing))
				legacy := newOwner("legacy-batch")
				legacy.Implicit = "update"
				want := recordID(namespace.Of(ns), rv(t, failing).Key())
				var fired atomic.Bool
				s.testHookWrote = func(w string, g *gen) error {
					if w == what && g.Key == want && g.ownedBy(legacy) && fired.CompareAndSwap(false, true) {
						return errors.New("injected: the reply to a write that landed was lost")
					}
					return nil
				}
				_, err := s.Acquire(bg, legacy, namespace.Of(ns), ids(t, 1, 2), time.Minute, 0)
				s.testHookWrote = nil
				if !fired.Load() || !errors.Is(err, ErrUnavailable) {
					t.Fatalf("acquire with a failed %s write: %v (fired %v), want ErrUnavailable", what, err, fired.Load())
				}
				sts, err := s.ConfirmedStatus(bg, newOwner("x"), namespace.Of(ns), ids(t, 1, 2))
				if err != nil {
					t.Fatal(err)
				}
				for _, st := range sts {
					if st.Held {
						t.Errorf("ConfirmedStatus of _id %s after the failed acquire: held by %+v, want free", st.ID, st.Holder)
					}
				}
				if _, err := s.Acquire(bg, newOwner("editor"), namespace.Of(ns), ids(t, 1, 2), time.Minute, 0); err != nil {
					t.Fatalf("acquire after a failed acquire of the same keys: %v, want granted (nobody holds them)", err)
				}
			})
		}
	}
}
