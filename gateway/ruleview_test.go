package gateway

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/policy"
)

// TestPolicyViewUsesConfigKeys: /policy shows each rule with the keys and
// units of the configuration file (it used to show Go field names and a
// lease margin in nanoseconds).
func TestPolicyViewUsesConfigKeys(t *testing.T) {
	b, err := json.Marshal(viewOfRule(policy.Rule{
		Match: "shop.orders", Mode: policy.Enforce, Inserts: policy.InsertsRequireUnlocked,
		AllowCollectionWrites: true, MaxCandidates: 50, LeaseMargin: 1500 * time.Millisecond,
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"match":"shop.orders","mode":"enforce","inserts":"requireUnlocked","allowCollectionWrites":true,"maxCandidates":50,"leaseMarginMS":1500}`
	if string(b) != want {
		t.Errorf("rule view\n got  %s\n want %s", b, want)
	}
}

func TestLocksLimitParameter(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int
		bad  bool
	}{{"", 0, false}, {"25", 25, false}, {"abc", 0, true}, {"0", 0, true}, {"-3", 0, true}} {
		n, err := queryLimit(tt.in)
		if (err != nil) != tt.bad || n != tt.want {
			t.Errorf("queryLimit(%q) = %d, %v", tt.in, n, err)
		}
		if err != nil && !strings.Contains(err.Error(), "positive whole number") {
			t.Errorf("queryLimit(%q): unhelpful error %v", tt.in, err)
		}
	}
}
