package inflight

import (
	"testing"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
)

// TestForcedKeysStayBounded: the tracker remembers the ended
// force-releases for writes checked before they ended, but not without
// bound; a write checked before one it forgot is refused at its launch
// (it cannot tell whether its locks were among them), and one checked
// after launches. Without the bound, forced grows by one entry per
// force-release for the life of the proxy.
func TestForcedKeysStayBounded(t *testing.T) {
	tr := New(Config{})
	one, err := docid.Of(int32(1))
	if err != nil {
		t.Fatal(err)
	}
	two, err := docid.Of(int32(2))
	if err != nil {
		t.Fatal(err)
	}
	locks := Locks{{NS: namespace.Of("shop.orders"), IDs: []docid.ID{one}}}
	early := tr.ForceSeq()
	for range 3 * keepForced {
		tr.Forcing(namespace.Of("shop.orders"), two)()
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if n := len(tr.forced); n > keepForced {
		t.Errorf("%d ended force-releases remembered, want at most %d", n, keepForced)
	}
	if !tr.forcedSinceLocked(locks, early) {
		t.Error("a write checked before force-releases that the tracker forgot was let launch")
	}
	if tr.forcedSinceLocked(locks, tr.ForceSeq()) {
		t.Error("a write checked after every force-release ended was refused")
	}
	recent := tr.ForceSeq()
	tr.mu.Unlock()
	tr.Forcing(namespace.Of("shop.orders"), two)()
	tr.mu.Lock()
	if tr.forcedSinceLocked(locks, recent) {
		t.Error("a force-release of another document refused the write")
	}
}
