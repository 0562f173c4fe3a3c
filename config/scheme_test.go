package config

import (
	"strings"
	"testing"
)

func TestValidateScheme(t *testing.T) {
	rule := func(s *Scheme) func(*Config) {
		return func(c *Config) {
			c.Policy.Namespaces = []NamespaceRule{{Match: "shop.orders", Mode: ModeEnforce, Scheme: s}}
		}
	}
	const k = "policy.namespaces[0].scheme"
	bad := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"unknown type", rule(&Scheme{Type: "mutex"}), k + `.type: must be one of lockgate, holderFields, lockDocument, flag, lockCollection, got "mutex"`},
		{"empty type", rule(&Scheme{}), k + `.type: must be one of lockgate, holderFields, lockDocument, flag, lockCollection, got ""`},
		{"lockCollection bad collection", rule(&Scheme{Type: SchemeLockCollection, Collection: "a$b"}), k + `.collection: collection name must not contain $ or NUL, got "a$b"`},
		{"lockCollection same fields", rule(&Scheme{Type: SchemeLockCollection, TsField: "x", AidField: "x"}), k + `.aidField: must differ from tsField "x"`},
		{"recordId without placeholder", rule(&Scheme{Type: SchemeLockCollection, RecordID: "lock_"}), k + `.recordId: must contain {_id} exactly once, got "lock_"`},
		{"recordId twice", rule(&Scheme{Type: SchemeLockCollection, RecordID: "{_id}{_id}"}), k + `.recordId: must contain {_id} exactly once`},
		{"recordId stray brace", rule(&Scheme{Type: SchemeLockCollection, RecordID: "{x}{_id}"}), k + `.recordId: must contain no braces or NUL besides {_id}`},
		{"recordId on flag", rule(&Scheme{Type: SchemeFlag, RecordID: "{_id}"}), k + `.recordId: is not used by scheme type "flag"; remove it`},
		{"expiresField with tsField", rule(&Scheme{Type: SchemeLockCollection, ExpiresField: "ExpireAt", TsField: "ts"}), k + `.tsField: is not used with expiresField "ExpireAt"`},
		{"expiresField with leaseMS", rule(&Scheme{Type: SchemeLockCollection, ExpiresField: "ExpireAt", LeaseMS: 1000}), k + `.leaseMS: is not used with expiresField "ExpireAt"`},
		{"expiresField with dots", rule(&Scheme{Type: SchemeLockCollection, ExpiresField: "a.b"}), k + `.expiresField: must be a field name without dots, got "a.b"`},
		{"expiresField is aidField", rule(&Scheme{Type: SchemeLockCollection, ExpiresField: "x", AidField: "x"}), k + `.aidField: must differ from expiresField "x"`},
		{"collection on flag", rule(&Scheme{Type: SchemeFlag, Collection: "locks"}), k + `.collection: is not used by scheme type "flag"; remove it`},
		{"holderFields without lease", rule(&Scheme{Type: SchemeHolderFields}), k + `.leaseMS: is required for holderFields: the application's lock timeout in milliseconds, got 0`},
		{"lease over max", rule(&Scheme{Type: SchemeFlag, LeaseMS: 700000}), k + `.leaseMS: must not exceed lockstore.maxLeaseMS (600000), got 700000`},
		{"field _id", rule(&Scheme{Type: SchemeFlag, Field: "_id"}), k + `.field: must not be _id, got "_id"`},
		{"field operator", rule(&Scheme{Type: SchemeFlag, Field: "$locked"}), k + `.field: must be a plain field name, got "$locked"`},
		{"bad path", rule(&Scheme{Type: SchemeFlag, Field: "a..b"}), k + `.field: must be a field path, got "a..b"`},
		{"actor with dots", rule(&Scheme{Type: SchemeLockDocument, ActorField: "a.b"}), k + `.actorField: must be a field name without dots, got "a.b"`},
		{"flag holder unknown", rule(&Scheme{Type: SchemeFlag, Holder: "thread"}), k + `.holder: must be one of client, session, got "thread"`},
		{"holderField on holderFields", rule(&Scheme{Type: SchemeHolderFields, LeaseMS: 1, HolderField: "k"}), k + `.holderField: is not used by scheme type "holderFields"; remove it`},
		{"holderField with dots", rule(&Scheme{Type: SchemeLockDocument, HolderField: "a.b"}), k + `.holderField: must be a field name without dots, got "a.b"`},
		{"holderField is expiry", rule(&Scheme{Type: SchemeLockDocument, HolderField: "expiresAt"}), k + `.holderField: must differ from expiresField "expiresAt"`},
		{"unused key", rule(&Scheme{Type: SchemeFlag, TimeField: "t"}), k + `.timeField: is not used by scheme type "flag"; remove it`},
		{"same fields", rule(&Scheme{Type: SchemeHolderFields, LeaseMS: 1, Field: "L", TimeField: "L"}), k + `.timeField: must differ from field "L"`},
		{"lockgate with fields", rule(&Scheme{Type: SchemeLockgate, Field: "x"}), k + `.field: is not used by scheme type "lockgate"; remove it`},
		{"fence with a scheme", func(c *Config) {
			c.Policy.Namespaces = []NamespaceRule{{Match: "shop.orders", Mode: ModeEnforce, Scheme: &Scheme{Type: SchemeFlag}, Fence: FenceDocument}}
		}, `policy.namespaces[0].fence: is not supported with scheme "flag"`},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			cfg := Default()
			c.mutate(cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate() = %v, want %q", err, c.want)
			}
		})
	}
	for _, s := range []*Scheme{
		nil,
		{Type: SchemeLockgate},
		{Type: SchemeHolderFields, LeaseMS: 30000},
		{Type: SchemeHolderFields, Field: "lock.id", TimeField: "lock.at", LeaseMS: 1},
		{Type: SchemeLockDocument},
		{Type: SchemeLockDocument, Field: "Lock", ActorField: "owner", ExpiresField: "until"},
		{Type: SchemeLockDocument, Field: "Lock", ActorField: "Actor", ExpiresField: "ExpireTime", HolderField: "LockKey"},
		{Type: SchemeFlag},
		{Type: SchemeFlag, Field: "busy", Holder: SchemeHolderSession, LeaseMS: 5000},
		{Type: SchemeLockCollection},
		{Type: SchemeLockCollection, Collection: "locks", TsField: "at", AidField: "owner", Holder: SchemeHolderSession, LeaseMS: 60000},
		{Type: SchemeLockCollection, Collection: "resourceLocks", RecordID: "lock_{_id}", ExpiresField: "ExpireAt"},
	} {
		cfg := Default()
		rule(s)(cfg)
		if err := cfg.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", s, err)
		}
	}
}

func TestParseScheme(t *testing.T) {
	cfg, err := Parse([]byte(`
upstream: {uri: "mongodb://127.0.0.1:27017/"}
policy:
  namespaces:
    - match: shop.jobs
      mode: enforce
      scheme: {type: flag, field: busy}
`))
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Policy.Namespaces[0].Scheme
	if s == nil || s.Type != SchemeFlag || s.Field != "busy" {
		t.Fatalf("scheme = %+v", s)
	}
	if _, err := Parse([]byte("policy:\n  namespaces:\n    - match: a.b\n      mode: enforce\n      scheme: {type: flag, lease: 1}\n")); err == nil || !strings.Contains(err.Error(), "lease") {
		t.Fatalf("unknown scheme key: %v", err)
	}
}
