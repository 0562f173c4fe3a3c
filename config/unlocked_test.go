package config

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestValidateUnlockedWriters(t *testing.T) {
	clients := &Clients{AppNames: []string{"batch"}}
	for _, tc := range []struct {
		name string
		rule NamespaceRule
		want string // "" when valid
	}{
		{"default", NamespaceRule{Match: "a.b", Mode: ModeEnforce}, ""},
		{"refuse", NamespaceRule{Match: "a.b", Mode: ModeEnforce, UnlockedWriters: UnlockedRefuse}, ""},
		{"refuseIfLocked", NamespaceRule{Match: "a.b", Mode: ModeEnforce, UnlockedWriters: UnlockedRefuseIfLocked}, ""},
		{"wait with bound", NamespaceRule{Match: "a.b", Mode: ModeEnforce, UnlockedWriters: UnlockedWait, UnlockedWaitMS: 250}, ""},
		{"per client set", NamespaceRule{Match: "a.b", Mode: ModeEnforce, Clients: clients, OtherClients: ModeEnforce,
			UnlockedWriters: UnlockedRefuse, OtherClientsUnlockedWriters: UnlockedWait, UnlockedWaitMS: 1000}, ""},
		{"unknown", NamespaceRule{Match: "a.b", Mode: ModeEnforce, UnlockedWriters: "queue"},
			`policy.namespaces[0].unlockedWriters: must be one of refuse, refuseIfLocked, wait, got "queue"`},
		{"case", NamespaceRule{Match: "a.b", Mode: ModeEnforce, UnlockedWriters: "Wait"},
			`policy.namespaces[0].unlockedWriters: must be one of refuse, refuseIfLocked, wait, got "Wait"`},
		{"others unknown", NamespaceRule{Match: "a.b", Mode: ModeEnforce, Clients: clients, OtherClientsUnlockedWriters: "later"},
			`policy.namespaces[0].otherClientsUnlockedWriters: must be one of refuse, refuseIfLocked, wait, got "later"`},
		{"others without clients", NamespaceRule{Match: "a.b", Mode: ModeEnforce, OtherClientsUnlockedWriters: UnlockedWait},
			`policy.namespaces[0].otherClientsUnlockedWriters: is only used with clients; use unlockedWriters for every client`},
		{"wait bound negative", NamespaceRule{Match: "a.b", Mode: ModeEnforce, UnlockedWriters: UnlockedWait, UnlockedWaitMS: -1},
			`policy.namespaces[0].unlockedWaitMS: must be between 0 (default 5000) and 300000 milliseconds, got -1`},
		{"wait bound too long", NamespaceRule{Match: "a.b", Mode: ModeEnforce, UnlockedWriters: UnlockedWait, UnlockedWaitMS: 300001},
			`policy.namespaces[0].unlockedWaitMS: must be between 0 (default 5000) and 300000 milliseconds, got 300001`},
		{"wait bound without wait", NamespaceRule{Match: "a.b", Mode: ModeEnforce, UnlockedWriters: UnlockedRefuseIfLocked, UnlockedWaitMS: 100},
			`policy.namespaces[0].unlockedWaitMS: is only used with unlockedWriters: wait (or otherClientsUnlockedWriters: wait); remove it`},
		{"scheme", NamespaceRule{Match: "a.b", Mode: ModeEnforce, UnlockedWriters: UnlockedWait,
			Scheme: &Scheme{Type: SchemeHolderFields, HolderField: "lockedBy", ExpiresField: "lockedUntil"}},
			`policy.namespaces[0].unlockedWriters: is not supported with scheme "holderFields"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.Policy.Namespaces = []NamespaceRule{tc.rule}
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("valid rule refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestUnlockedWritersFromYAML(t *testing.T) {
	var r NamespaceRule
	src := "match: shop.orders\nmode: enforce\nunlockedWriters: wait\nunlockedWaitMS: 750\n"
	if err := yaml.Unmarshal([]byte(src), &r); err != nil {
		t.Fatal(err)
	}
	if r.UnlockedWriters != UnlockedWait || r.UnlockedWaitMS != 750 {
		t.Fatalf("decoded %+v", r)
	}
}

func TestValidateWakeListen(t *testing.T) {
	for addr, ok := range map[string]bool{"": true, "127.0.0.1:0": true, "10.1.2.3:9219": true, "lockgate-1:9219": true,
		"0.0.0.0:9219": false, "[::]:9219": false, ":9219": false, "9219": false} {
		c := Default()
		c.Lockstore.WakeListen = addr
		err := c.Validate()
		if ok != (err == nil) || !ok && !strings.Contains(err.Error(), "lockstore.wakeListen: must be host:port") {
			t.Errorf("wakeListen %q: %v", addr, err)
		}
	}
}
