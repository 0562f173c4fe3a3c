package gateway

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/policy"
)

// TestPolicyViewShowsSchemes: /policy shows a rule's scheme and client
// narrowing with the configuration's keys.
func TestPolicyViewShowsSchemes(t *testing.T) {
	p, err := policy.CompileWithLease(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{
		{Match: "jobs.flag", Mode: config.ModeEnforce, Scheme: &config.Scheme{Type: config.SchemeFlag},
			Clients: &config.Clients{AppNames: []string{"billing"}, Networks: []string{"10.1.0.0/16"}}},
		{Match: "jobs.ld", Mode: config.ModeAudit, Scheme: &config.Scheme{Type: config.SchemeLockDocument}},
	}}, 30000)
	if err != nil {
		t.Fatal(err)
	}
	rules, _ := p.Rules()
	var got []string
	for _, r := range rules {
		b, err := json.Marshal(viewOfRule(r))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(b))
	}
	for i, want := range []string{
		`"scheme":{"type":"flag","field":"locked","leaseMS":30000,"holder":"client"},"clients":{"appNames":["billing"],"networks":["10.1.0.0/16"]},"otherClients":"audit"}`,
		`"scheme":{"type":"lockDocument","field":"Lock","actorField":"actor","expiresField":"expiresAt","holderField":"actor"}}`,
	} {
		if !strings.HasSuffix(got[i], want) {
			t.Errorf("rule view\n got  %s\n want ...%s", got[i], want)
		}
	}
}
