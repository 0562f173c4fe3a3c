package proxy

import (
	"context"
	"testing"
)

// TestChainRunsStagesInOrderUntilOneSettles: a stage sees a request only
// when every stage before it passed it, the first that settles decides,
// and a request nobody settles is forwarded unchanged.
func TestChainRunsStagesInOrderUntilOneSettles(t *testing.T) {
	var seen []string
	stage := func(name string, settle bool) Stage {
		return StageFunc(func(ctx context.Context, req *Request) (Decision, bool) {
			seen = append(seen, name)
			if settle {
				return Decision{Action: Reply, Reason: name}, true
			}
			return Decision{}, false
		})
	}
	req := &Request{}
	d := Chain{stage("boundary", false), stage("locks", true), stage("enforce", true)}.Intercept(context.Background(), req)
	if d.Action != Reply || d.Reason != "locks" {
		t.Fatalf("decision %+v, want the lock stage's reply", d)
	}
	if len(seen) != 2 || seen[0] != "boundary" || seen[1] != "locks" {
		t.Fatalf("stages run: %v, want boundary then locks only", seen)
	}
	seen = nil
	d = Chain{stage("boundary", false), stage("enforce", false)}.Intercept(context.Background(), req)
	if d.Action != Forward || len(seen) != 2 {
		t.Fatalf("nobody settled: %+v after %v, want Forward after both", d, seen)
	}
}
