package lockcmd

import (
	"context"
	"testing"

	"github.com/lockgate/lockgate/proxy"
)

// TestReleaseAllIsChargedAsAScan: a releaseLock without ids makes the lock
// store scan (the heads and the claims, on FerretDB), so it takes
// releaseAllCost ids of its connection's throttle, not the one id its
// arguments would count: a connection repeating it is slowed to
// idsPerSecond/releaseAllCost a second (the lock store bounds the scans
// of all connections together, lockstore releaseAllScans).
func TestReleaseAllIsChargedAsAScan(t *testing.T) {
	s, _ := stage(t, false)
	var asked []int
	s.cfg.Admit = func(_ context.Context, _ *proxy.ClientInfo, n int) bool {
		asked = append(asked, n)
		return true
	}
	decide(t, s, lockRequest(t, "releaseLock", 1, ids(7, 8)))
	decide(t, s, lockRequest(t, "releaseLock", 1, nil))
	if len(asked) != 2 || asked[0] != 2 || asked[1] != releaseAllCost {
		t.Fatalf("admitted with %v ids, want [2 %d]: a release-all is charged as a scan", asked, releaseAllCost)
	}
}
