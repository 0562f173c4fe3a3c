package config

import (
	"strings"
	"testing"
	"time"
)

func TestEnvName(t *testing.T) {
	for key, want := range map[string]string{
		"listen":                     "LOCKGATE_LISTEN",
		"upstream.uri":               "LOCKGATE_UPSTREAM_URI",
		"lockstore.uri":              "LOCKGATE_LOCKSTORE_URI",
		"log.level":                  "LOCKGATE_LOG_LEVEL",
		"lockstore.defaultLeaseMS":   "LOCKGATE_LOCKSTORE_DEFAULT_LEASE_MS",
		"limits.maxLockIDs":          "LOCKGATE_LIMITS_MAX_LOCK_IDS",
		"tls.caFile":                 "LOCKGATE_TLS_CA_FILE",
		"adminAuth.tokenFile":        "LOCKGATE_ADMIN_AUTH_TOKEN_FILE",
		"limits.maxMessageSizeBytes": "LOCKGATE_LIMITS_MAX_MESSAGE_SIZE_BYTES",
	} {
		if got := EnvName(key); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", key, got, want)
		}
	}
}

// Every key of the file has a variable, and setting each one changes what
// it names: nothing in Config is left without an environment override.
func TestEveryKeyHasAWorkingEnvVar(t *testing.T) {
	vars := EnvVars()
	if len(vars) < 30 {
		t.Fatalf("only %d variables", len(vars))
	}
	seen := map[string]bool{}
	for _, v := range vars {
		if seen[v.Name] {
			t.Errorf("two keys share %s", v.Name)
		}
		seen[v.Name] = true
		sample := map[string]string{"string": "x-" + v.Key, "integer": "7", "boolean": "true", "duration": "3s",
			"list (YAML)": `[{match: "shop.orders", mode: enforce}]`}[v.Type]
		if sample == "" {
			t.Errorf("%s: no sample for type %s", v.Name, v.Type)
			continue
		}
		c := Default()
		before := valueOf(t, c, v.Key)
		if err := c.ApplyEnvVars(env(map[string]string{v.Name: sample})); err != nil {
			t.Errorf("%s=%s: %v", v.Name, sample, err)
			continue
		}
		if after := valueOf(t, c, v.Key); after == before {
			t.Errorf("%s=%s left %s at %s", v.Name, sample, v.Key, before)
		}
	}
}

func valueOf(t *testing.T, c *Config, key string) string {
	for _, f := range fields(c) {
		if f.key == key {
			return valueText(f.v)
		}
	}
	t.Fatalf("no key %s", key)
	return ""
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestEnvVarsParseAndRefuse(t *testing.T) {
	c := Default()
	err := c.ApplyEnvVars(env(map[string]string{
		"LOCKGATE_LOCKSTORE_DEFAULT_LEASE_MS":         "5000",
		"LOCKGATE_SHUTDOWN_TIMEOUT":                   "20s",
		"LOCKGATE_UPSTREAM_URI":                       "mongodb://u:p#ss@db:27017/?replicaSet=rs0",
		"LOCKGATE_POLICY_NAMESPACES":                  `[{"match": "shop.orders", "mode": "enforce"}, {match: "shop.*", mode: audit}]`,
		"LOCKGATE_POLICY_ALLOW_SESSION_INTROSPECTION": "true",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Lockstore.DefaultLeaseMS != 5000 || c.ShutdownTimeout.D() != 20*time.Second ||
		c.Upstream.URI != "mongodb://u:p#ss@db:27017/?replicaSet=rs0" || len(c.Policy.Namespaces) != 2 ||
		c.Policy.Namespaces[1].Mode != ModeAudit || !c.Policy.AllowSessionIntrospection {
		t.Fatalf("got %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, val := range map[string]string{
		"LOCKGATE_LOCKSTORE_DEFAULT_LEASE_MS":         "soon",
		"LOCKGATE_SHUTDOWN_TIMEOUT":                   "20",
		"LOCKGATE_POLICY_NAMESPACES":                  `[{match: shop.orders, mod: enforce}]`,
		"LOCKGATE_POLICY_ALLOW_SESSION_INTROSPECTION": "maybe",
	} {
		err := Default().ApplyEnvVars(env(map[string]string{name: val}))
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: %v, want an error naming the variable", name, val, err)
		}
	}
}

// The older names stay accepted; the rule's name wins over them.
func TestEnvAliases(t *testing.T) {
	c := Default()
	if err := c.ApplyEnvVars(env(map[string]string{EnvAdminToken: "/old"})); err != nil || c.AdminAuth.TokenFile != "/old" {
		t.Fatalf("alias: %v %q", err, c.AdminAuth.TokenFile)
	}
	c = Default()
	if err := c.ApplyEnvVars(env(map[string]string{EnvAdminToken: "/old", "LOCKGATE_ADMIN_AUTH_TOKEN_FILE": "/new"})); err != nil || c.AdminAuth.TokenFile != "/new" {
		t.Fatalf("both: %v %q", err, c.AdminAuth.TokenFile)
	}
}
