package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default() does not validate: %v", err)
	}
}

func TestParseEmptyMeansDefaults(t *testing.T) {
	for _, doc := range []string{"", "# only a comment\n", "---\n"} {
		cfg, err := Parse([]byte(doc))
		if err != nil {
			t.Fatalf("Parse(%q): %v", doc, err)
		}
		if !reflect.DeepEqual(cfg, Default()) {
			t.Errorf("Parse(%q) = %+v, want Default()", doc, cfg)
		}
	}
}

// The core of DESIGN §6 must keep parsing to exactly these values.
func TestParseDesignCore(t *testing.T) {
	doc := `
listen: 127.0.0.1:27018
admin: 127.0.0.1:9218
upstream:
  uri: mongodb://127.0.0.1:27017/
lockstore:
  uri: ""
  database: lockgate
  collection: locks
  defaultLeaseMS: 30000
  maxLeaseMS: 600000
policy:
  default: off
  namespaces:
    - match: shop.orders
      mode: enforce
    - match: "shop.*"
      mode: audit
log:
  level: info
  format: json
`
	cfg, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Policy.Namespaces = []NamespaceRule{
		{Match: "shop.orders", Mode: ModeEnforce},
		{Match: "shop.*", Mode: ModeAudit},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("got %+v\nwant %+v", cfg, want)
	}
	// YAML 1.1 would read an unquoted off as false; ours must stay "off".
	if cfg.Policy.Default != ModeOff {
		t.Errorf("policy.default = %q, want off", cfg.Policy.Default)
	}
}

func TestParseAddedKeys(t *testing.T) {
	doc := `
tls:
  certFile: /c.pem
  keyFile: /k.pem
  caFile: /ca.pem
  clientAuth: require-and-verify
upstream:
  dialTimeout: 2500ms
limits:
  maxMessageSizeBytes: 20000000
shutdownTimeout: 1m
`
	cfg, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := cfg.Upstream.DialTimeout.D(); got != 2500*time.Millisecond {
		t.Errorf("dialTimeout = %v", got)
	}
	if got := cfg.ShutdownTimeout.D(); got != time.Minute {
		t.Errorf("shutdownTimeout = %v", got)
	}
	if cfg.Limits.MaxMessageSizeBytes != 20000000 || cfg.TLS.ClientAuth != ClientAuthRequireAndVerify || !cfg.TLS.Enabled() {
		t.Errorf("got %+v", cfg)
	}
	if cfg.Upstream.URI != DefaultUpstreamURI {
		t.Errorf("upstream.uri default lost when only dialTimeout is set: %q", cfg.Upstream.URI)
	}
}

func TestParseErrorsNameKeyAndLine(t *testing.T) {
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"unknown top-level key", "listen: a:1\nlisen: b:2\n",
			[]string{"line 2: lisen: unknown key", "valid keys here: listen, admin"}},
		{"unknown nested key", "upstream:\n  uri: mongodb://x/\n  url: mongodb://y/\n",
			[]string{"line 3: upstream.url: unknown key", "valid keys here: uri, dialTimeout"}},
		{"unknown key in a rule", "policy:\n  namespaces:\n    - match: a.b\n      mod: audit\n",
			[]string{"line 4: policy.namespaces[0].mod: unknown key", "match, mode"}},
		{"wrong type", "lockstore:\n  maxLeaseMS: ten\n",
			[]string{`line 2: lockstore.maxLeaseMS: want a whole number of milliseconds, e.g. 30000 for 30 s; got "ten"`}},
		// A duration written where milliseconds are due (issue 9): the key,
		// what it takes, and what was given; never the YAML library's own
		// "cannot unmarshal !!str".
		{"duration where milliseconds are due", "lockstore:\n  defaultLeaseMS: \"30s\"\n",
			[]string{`line 2: lockstore.defaultLeaseMS: want a whole number of milliseconds, e.g. 30000 for 30 s; got "30s"`}},
		{"boolean expected", "policy:\n  allowSessionIntrospection: maybe\n",
			[]string{`line 2: policy.allowSessionIntrospection: want true or false; got "maybe"`}},
		// Indentation mistakes are reported on the line that has them (the
		// parser names the line where the enclosing block began).
		{"key indented less than its siblings", "upstream:\n  uri: mongodb://x/\n dialTimeout: 5s\n",
			[]string{"line 3: indented by 1 spaces, which matches none of the keys above it"}},
		{"key indented deeper than a key with a value", "policy:\n  default: off\n   namespaces: []\n",
			[]string{"line 3: indented by 3 spaces, deeper than the key above it"}},
		{"tab indentation", "policy:\n\tdefault: off\n",
			[]string{"line 2: indented with a tab"}},
		{"bare number duration", "shutdownTimeout: 15\n",
			[]string{`line 1: shutdownTimeout: want a duration string such as "15s", got "15"`}},
		{"bad duration", "upstream:\n  dialTimeout: 10 seconds\n",
			[]string{`line 2: upstream.dialTimeout: want a duration string`}},
		{"namespaces not a list", "policy:\n  namespaces: shop.orders\n",
			[]string{"line 2: policy.namespaces: want a list; got"}},
		{"syntax error", "listen: [\n", []string{"config: yaml:"}},
		{"two documents", "listen: a:1\n---\nadmin: b:2\n", []string{"more than one YAML document"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			if err == nil {
				t.Fatal("Parse accepted it")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestValidateErrors(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string // the whole error when only this is wrong
	}{
		{"listen empty", func(c *Config) { c.Listen = "" },
			`listen: must be host:port ("127.0.0.1:27018", ":27018"), got ""`},
		{"listen no port", func(c *Config) { c.Listen = "localhost" },
			`listen: must be host:port ("127.0.0.1:27018", ":27018"), got "localhost"`},
		{"listen bad port", func(c *Config) { c.Listen = "127.0.0.1:70000" },
			`listen: port must be a number from 0 to 65535, got "70000"`},
		{"listen bad host", func(c *Config) { c.Listen = "a b:1" },
			`listen: host "a b" is not a hostname or IP address`},
		{"admin bad", func(c *Config) { c.Admin = "9218" },
			`admin: must be host:port ("127.0.0.1:27018", ":27018"), got "9218"`},
		{"admin equals listen", func(c *Config) { c.Admin = c.Listen },
			`admin: must differ from listen (127.0.0.1:27018)`},
		{"tls key without cert", func(c *Config) { c.TLS.KeyFile = "k" },
			`tls.certFile: required when tls.keyFile is set`},
		{"tls cert without key", func(c *Config) { c.TLS.CertFile = "c" },
			`tls.keyFile: required when tls.certFile is set`},
		{"tls clientAuth unknown", func(c *Config) { c.TLS.ClientAuth = "always" },
			`tls.clientAuth: must be one of none, request, require-and-verify, got "always"`},
		{"tls clientAuth empty", func(c *Config) { c.TLS.ClientAuth = "" },
			`tls.clientAuth: must be one of none, request, require-and-verify, got ""`},
		{"tls client auth without listener TLS", func(c *Config) { c.TLS.ClientAuth = ClientAuthRequest },
			`tls.certFile: required when tls.caFile or tls.clientAuth is set (client certificates need a TLS listener)`},
		{"tls caFile without listener TLS", func(c *Config) { c.TLS.CAFile = "ca" },
			`tls.certFile: required when tls.caFile or tls.clientAuth is set (client certificates need a TLS listener)`},
		{"tls require without CA", func(c *Config) {
			c.TLS.CertFile, c.TLS.KeyFile, c.TLS.ClientAuth = "c", "k", ClientAuthRequireAndVerify
		}, `tls.caFile: required when tls.clientAuth is "require-and-verify": client certificates are verified against it`},
		{"upstream uri empty", func(c *Config) { c.Upstream.URI = "" },
			`upstream.uri: required: a MongoDB connection string such as "mongodb://127.0.0.1:27017/"`},
		{"upstream uri scheme", func(c *Config) { c.Upstream.URI = "http://db:27017" },
			`upstream.uri: must start with mongodb:// or mongodb+srv://, got "http://db:27017"`},
		{"upstream uri no host, password redacted", func(c *Config) { c.Upstream.URI = "mongodb://u:secret@/db" },
			`upstream.uri: names no host, got "mongodb://REDACTED@/db"`},
		{"upstream dialTimeout zero", func(c *Config) { c.Upstream.DialTimeout = 0 },
			`upstream.dialTimeout: must be a duration above 0s and at most 5m0s, got "0s"`},
		{"upstream dialTimeout huge", func(c *Config) { c.Upstream.DialTimeout = Duration(time.Hour) },
			`upstream.dialTimeout: must be a duration above 0s and at most 5m0s, got "1h0m0s"`},
		{"lockstore uri scheme", func(c *Config) { c.Lockstore.URI = "db:27017" },
			`lockstore.uri: must start with mongodb:// or mongodb+srv://, got "db:27017"`},
		{"lockstore database empty", func(c *Config) { c.Lockstore.Database = "" },
			`lockstore.database: database name must not be empty, got ""`},
		{"lockstore database dot", func(c *Config) { c.Lockstore.Database = "a.b" },
			`lockstore.database: database name must not contain any of / \ . space " $ * < > : | ? or NUL, got "a.b"`},
		{"lockstore database long", func(c *Config) { c.Lockstore.Database = strings.Repeat("d", 64) },
			`lockstore.database: database name must be at most 63 bytes, got "` + strings.Repeat("d", 64) + `"`},
		{"lockstore collection empty", func(c *Config) { c.Lockstore.Collection = "" },
			`lockstore.collection: collection name must not be empty, got ""`},
		{"lockstore collection dollar", func(c *Config) { c.Lockstore.Collection = "lo$ks" },
			`lockstore.collection: collection name must not contain $ or NUL, got "lo$ks"`},
		{"lockstore collection system", func(c *Config) { c.Lockstore.Collection = "system.locks" },
			`lockstore.collection: system collections cannot be used, got "system.locks"`},
		{"defaultLeaseMS zero", func(c *Config) { c.Lockstore.DefaultLeaseMS = 0 },
			`lockstore.defaultLeaseMS: must be between 1 and lockstore.maxLeaseMS (600000), got 0`},
		{"defaultLeaseMS above max", func(c *Config) { c.Lockstore.DefaultLeaseMS = 600001 },
			`lockstore.defaultLeaseMS: must be between 1 and lockstore.maxLeaseMS (600000), got 600001`},
		{"maxLeaseMS above a day", func(c *Config) { c.Lockstore.MaxLeaseMS = MaxLeaseLimitMS + 1 },
			`lockstore.maxLeaseMS: must be between 1 and 86400000 (one day), got 86400001`},
		{"policy default unknown", func(c *Config) { c.Policy.Default = "strict" },
			`policy.default: must be one of off, audit, enforce, got "strict"`},
		{"policy default empty", func(c *Config) { c.Policy.Default = "" },
			`policy.default: must be one of off, audit, enforce, got ""`},
		{"rule mode missing", func(c *Config) { c.Policy.Namespaces = []NamespaceRule{{Match: "a.b"}} },
			`policy.namespaces[0].mode: must be one of off, audit, enforce, got ""`},
		{"rule mode unknown", func(c *Config) {
			c.Policy.Namespaces = []NamespaceRule{{Match: "a.b", Mode: ModeAudit}, {Match: "a.c", Mode: "Enforce"}}
		}, `policy.namespaces[1].mode: must be one of off, audit, enforce, got "Enforce"`},
		{"rule match star", func(c *Config) { c.Policy.Namespaces = []NamespaceRule{{Match: "*", Mode: ModeAudit}} },
			`policy.namespaces[0].match: must be "db.collection" or "db.*" (use policy.default for every namespace), got "*"`},
		{"rule match no dot", func(c *Config) { c.Policy.Namespaces = []NamespaceRule{{Match: "shop", Mode: ModeAudit}} },
			`policy.namespaces[0].match: must be "db.collection" or "db.*", got "shop"`},
		{"rule match empty", func(c *Config) { c.Policy.Namespaces = []NamespaceRule{{Match: "", Mode: ModeAudit}} },
			`policy.namespaces[0].match: must be "db.collection" or "db.*", got ""`},
		{"rule match empty db", func(c *Config) { c.Policy.Namespaces = []NamespaceRule{{Match: ".orders", Mode: ModeAudit}} },
			`policy.namespaces[0].match: must be "db.collection" or "db.*": database name must not be empty, got ".orders"`},
		{"rule match db wildcard", func(c *Config) { c.Policy.Namespaces = []NamespaceRule{{Match: "*.orders", Mode: ModeAudit}} },
			`policy.namespaces[0].match: must be "db.collection" or "db.*": database name must not contain any of / \ . space " $ * < > : | ? or NUL, got "*.orders"`},
		{"rule match partial wildcard", func(c *Config) { c.Policy.Namespaces = []NamespaceRule{{Match: "shop.ord*", Mode: ModeAudit}} },
			`policy.namespaces[0].match: must be "db.collection" or "db.*": a wildcard must be the whole collection part, got "shop.ord*"`},
		{"rule match empty collection", func(c *Config) { c.Policy.Namespaces = []NamespaceRule{{Match: "shop.", Mode: ModeAudit}} },
			`policy.namespaces[0].match: must be "db.collection" or "db.*": collection name must not be empty, got "shop."`},
		{"rule match dollar", func(c *Config) { c.Policy.Namespaces = []NamespaceRule{{Match: "shop.$cmd", Mode: ModeAudit}} },
			`policy.namespaces[0].match: must be "db.collection" or "db.*": collection name must not contain $ or NUL, got "shop.$cmd"`},
		{"rule match system", func(c *Config) { c.Policy.Namespaces = []NamespaceRule{{Match: "shop.system.users", Mode: ModeAudit}} },
			`policy.namespaces[0].match: must be "db.collection" or "db.*": system collections cannot be used, got "shop.system.users"`},
		{"rule match too long", func(c *Config) {
			c.Policy.Namespaces = []NamespaceRule{{Match: "shop." + strings.Repeat("c", 251), Mode: ModeAudit}}
		}, `policy.namespaces[0].match: must be "db.collection" or "db.*": namespace must be at most 255 bytes, got "shop.` + strings.Repeat("c", 251) + `"`},
		{"rule duplicate", func(c *Config) {
			c.Policy.Namespaces = []NamespaceRule{{Match: "shop.*", Mode: ModeAudit}, {Match: "shop.orders", Mode: ModeEnforce}, {Match: "shop.*", Mode: ModeOff}}
		}, `policy.namespaces[2].match: "shop.*" is already matched by policy.namespaces[0]; one rule per namespace`},
		{"maxMessageSize too small", func(c *Config) { c.Limits.MaxMessageSizeBytes = 1 << 20 },
			`limits.maxMessageSizeBytes: must be between 16793600 and 48000000, got 1048576`},
		{"maxMessageSize too large", func(c *Config) { c.Limits.MaxMessageSizeBytes = 48000001 },
			`limits.maxMessageSizeBytes: must be between 16793600 and 48000000, got 48000001`},
		{"shutdownTimeout negative", func(c *Config) { c.ShutdownTimeout = Duration(-time.Second) },
			`shutdownTimeout: must be a duration above 0s and at most 10m0s, got "-1s"`},
		{"log level", func(c *Config) { c.Log.Level = "verbose" },
			`log.level: must be one of debug, info, warn, error, got "verbose"`},
		{"log format", func(c *Config) { c.Log.Format = "text" },
			`log.format: must be one of json, console, got "text"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.mutate(c)
			err := c.Validate()
			if err == nil {
				t.Fatal("Validate accepted it")
			}
			if err.Error() != tt.want {
				t.Errorf("got  %s\nwant %s", err, tt.want)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || !strings.HasPrefix(tt.want, fe.Key+": ") {
				t.Errorf("error is not a *FieldError naming the key: %#v", err)
			}
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
	}{
		{"any port", func(c *Config) { c.Listen, c.Admin = ":0", ":0" }},
		{"ipv6", func(c *Config) { c.Listen = "[::1]:27018" }},
		{"srv uri with credentials and options", func(c *Config) {
			c.Upstream.URI = "mongodb+srv://u:p@cluster0.example.net/?retryWrites=true"
		}},
		{"replica set uri", func(c *Config) {
			c.Upstream.URI = "mongodb://a:27017,b:27017,c:27017/?replicaSet=rs0"
		}},
		{"separate lockstore", func(c *Config) { c.Lockstore.URI = "mongodb://locks:27017/" }},
		{"lease bounds", func(c *Config) { c.Lockstore.DefaultLeaseMS, c.Lockstore.MaxLeaseMS = 1, 1 }},
		{"dotted collection and wildcard", func(c *Config) {
			c.Policy.Namespaces = []NamespaceRule{{Match: "shop.orders.archive", Mode: ModeEnforce}, {Match: "shop.*", Mode: ModeAudit}, {Match: "crm.*", Mode: ModeOff}}
		}},
		{"tls request without CA", func(c *Config) {
			c.TLS = TLS{CertFile: "c", KeyFile: "k", ClientAuth: ClientAuthRequest}
		}},
		{"min message size", func(c *Config) { c.Limits.MaxMessageSizeBytes = MinMaxMessageSizeBytes }},
		{"console debug", func(c *Config) { c.Log = Log{Level: LogLevelDebug, Format: LogFormatConsole} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.mutate(c)
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := Default()
	c.Listen = ""
	c.Policy.Default = "x"
	c.Log.Format = "y"
	err := c.Validate()
	if err == nil {
		t.Fatal("accepted")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "listen: ") ||
		!strings.HasPrefix(lines[1], "policy.default: ") || !strings.HasPrefix(lines[2], "log.format: ") {
		t.Errorf("want one line per problem in file order, got:\n%s", err)
	}
}

func TestPrecedenceFileEnvFlags(t *testing.T) {
	file := `
listen: 10.0.0.1:1000
admin: 10.0.0.1:2000
upstream:
  uri: mongodb://file:27017/
lockstore:
  uri: mongodb://file-locks:27017/
log:
  level: warn
`
	env := map[string]string{
		EnvAdmin:             "10.0.0.2:2000",
		EnvUpstreamURI:       "mongodb://env:27017/",
		EnvLogLevel:          "error",
		"LOCKGATE_UNRELATED": "ignored",
	}
	flags := Overrides{UpstreamURI: "mongodb://flag:27017/", LogLevel: "debug"}

	cfg, err := Parse([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ApplyEnv(func(k string) string { return env[k] })
	cfg.Apply(flags)

	want := map[string][2]string{
		"listen (file only)":        {cfg.Listen, "10.0.0.1:1000"},
		"admin (env over file)":     {cfg.Admin, "10.0.0.2:2000"},
		"upstream.uri (flag wins)":  {cfg.Upstream.URI, "mongodb://flag:27017/"},
		"lockstore.uri (file only)": {cfg.Lockstore.URI, "mongodb://file-locks:27017/"},
		"log.level (flag over env)": {string(cfg.Log.Level), "debug"},
		"log.format (default kept)": {string(cfg.Log.Format), "json"},
	}
	for name, gw := range want {
		if gw[0] != gw[1] {
			t.Errorf("%s = %q, want %q", name, gw[0], gw[1])
		}
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestApplyEnvEachVariable(t *testing.T) {
	tests := []struct {
		env   string
		value string
		set   func(*Config, string)
	}{
		{EnvListen, "0.0.0.0:27018", func(c *Config, v string) { c.Listen = v }},
		{EnvAdmin, "0.0.0.0:9218", func(c *Config, v string) { c.Admin = v }},
		{EnvUpstreamURI, "mongodb://db:27017/", func(c *Config, v string) { c.Upstream.URI = v }},
		{EnvLockstoreURI, "mongodb://locks:27017/", func(c *Config, v string) { c.Lockstore.URI = v }},
		{EnvLogLevel, "debug", func(c *Config, v string) { c.Log.Level = LogLevel(v) }},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			got := Default()
			got.ApplyEnv(func(k string) string {
				if k == tt.env {
					return tt.value
				}
				return ""
			})
			// Exactly that one setting changes.
			want := Default()
			tt.set(want, tt.value)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v\nwant %+v", got, want)
			}
		})
	}
	empty := Default()
	empty.ApplyEnv(func(string) string { return "" })
	if !reflect.DeepEqual(empty, Default()) {
		t.Errorf("an empty environment changed the config: %+v", empty)
	}
	// An invalid value from the environment is caught by Validate with the
	// key it lands in.
	c := Default()
	c.ApplyEnv(func(k string) string {
		if k == EnvLogLevel {
			return "loud"
		}
		return ""
	})
	if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "log.level: ") {
		t.Errorf("Validate() = %v, want a log.level error", err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("listen: 127.0.0.1:1\n"), 0o600)
	cfg, err := Load(good)
	if err != nil || cfg.Listen != "127.0.0.1:1" {
		t.Fatalf("Load = %+v, %v", cfg, err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("listen: 127.0.0.1:1\nbogus: 1\n"), 0o600)
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), bad+": config: line 2: bogus: unknown key") {
		t.Errorf("Load(bad) error = %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("Load(missing) error = %v", err)
	}
}

func TestDurationRoundTrip(t *testing.T) {
	cfg := Default()
	cfg.ShutdownTimeout = Duration(90 * time.Second)
	cfg.Policy.Namespaces = []NamespaceRule{{Match: "a.b", Mode: ModeAudit}}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "shutdownTimeout: 1m30s") {
		t.Errorf("marshalled:\n%s", out)
	}
	back, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, cfg) {
		t.Errorf("round trip changed the config:\n%+v\n%+v", back, cfg)
	}
}

func TestEnumListsMatchValid(t *testing.T) {
	for _, m := range Modes() {
		if !m.Valid() {
			t.Errorf("mode %q not valid", m)
		}
	}
	if Mode("OFF").Valid() || Mode("").Valid() {
		t.Error("modes are case-sensitive and never empty")
	}
	if LogLevel("trace").Valid() || LogFormat("text").Valid() || ClientAuth("require").Valid() {
		t.Error("unknown enum value accepted")
	}
}

// The example file is the configuration reference: it must parse, validate,
// show every key of Config, and explain each one in a comment.
func TestExampleDocumentsEveryKey(t *testing.T) {
	const path = "../config.example.yaml"
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("%s does not validate: %v", path, err)
	}
	// The example shows the defaults (its rules are illustrations), so
	// "Default: X" in its comments cannot drift from Default().
	shown := *cfg
	shown.Policy.Namespaces = nil
	if !reflect.DeepEqual(&shown, Default()) {
		t.Errorf("%s values differ from Default():\n%+v\n%+v", path, &shown, Default())
	}

	data, _ := os.ReadFile(path)
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		t.Fatal(err)
	}
	present := map[string]bool{}   // dotted key -> seen
	commented := map[string]bool{} // dotted key -> seen with a comment
	walkExample(&root, "", false, present, commented)

	want := structKeys(reflect.TypeFor[Config](), "")
	if len(want) < 20 {
		t.Fatalf("structKeys found only %d keys; the walker is broken: %v", len(want), want)
	}
	for _, k := range want {
		if !present[k] {
			t.Errorf("%s: key %s is missing", path, k)
		} else if !commented[k] {
			t.Errorf("%s: key %s has no comment", path, k)
		}
	}
	for k := range present {
		if !contains(want, k) {
			t.Errorf("%s: key %s is not a Config field", path, k)
		}
	}
}

var indexRE = regexp.MustCompile(`\[\d+\]`)

func walkExample(n *yaml.Node, prefix string, itemComment bool, present, commented map[string]bool) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			walkExample(c, prefix, false, present, commented)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			path := k.Value
			if prefix != "" {
				path = prefix + "." + k.Value
			}
			path = indexRE.ReplaceAllString(path, "")
			if v.Kind == yaml.ScalarNode || scalarList(v) {
				present[path] = true
			}
			// The first key of a list item carries the item's comment.
			if k.HeadComment != "" || k.LineComment != "" || v.LineComment != "" || (i == 0 && itemComment) {
				commented[path] = true
			}
			walkExample(v, path, false, present, commented)
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			walkExample(c, prefix, c.HeadComment != "", present, commented)
		}
	}
}

// scalarList reports whether n is a list of scalars (a leaf key's value).
func scalarList(n *yaml.Node) bool {
	if n.Kind != yaml.SequenceNode {
		return false
	}
	for _, c := range n.Content {
		if c.Kind != yaml.ScalarNode {
			return false
		}
	}
	return true
}

// structKeys lists the dotted yaml keys of every leaf field of t; list
// elements contribute their keys without an index.
func structKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for f := range t.Fields() {
		name := yamlName(f)
		if name == "" {
			continue
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		ft := f.Type
		if ft.Kind() == reflect.Slice || ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			keys = append(keys, structKeys(ft, path)...)
			continue
		}
		keys = append(keys, path)
	}
	return keys
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestValidatePolicyOptions(t *testing.T) {
	cases := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"inserts unknown", func(c *Config) {
			c.Policy.Namespaces = []NamespaceRule{{Match: "a.b", Mode: ModeEnforce, Inserts: "deny"}}
		}, `policy.namespaces[0].inserts: must be one of allow, requireUnlocked, got "deny"`},
		{"rule maxCandidates negative", func(c *Config) {
			c.Policy.Namespaces = []NamespaceRule{{Match: "a.b", Mode: ModeEnforce, MaxCandidates: -1}}
		}, `policy.namespaces[0].maxCandidates: must be between 0 (use policy.maxCandidates) and 100000, got -1`},
		{"maxCandidates zero", func(c *Config) { c.Policy.MaxCandidates = 0 },
			`policy.maxCandidates: must be between 1 and 100000, got 0`},
		{"leaseMargin negative", func(c *Config) { c.Policy.LeaseMarginMS = -5 },
			`policy.leaseMarginMS: must be between 0 and 600000, got -5`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.edit(c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
	c := Default()
	c.Policy.Namespaces = []NamespaceRule{{Match: "a.b", Mode: ModeEnforce, Inserts: InsertsRequireUnlocked, MaxCandidates: 5, AllowCollectionWrites: true}}
	if err := c.Validate(); err != nil {
		t.Fatalf("valid rule refused: %v", err)
	}
}

func TestAuditValidation(t *testing.T) {
	for _, tc := range []struct {
		set  func(*Audit)
		keys []string
	}{
		{func(a *Audit) { a.Enabled = true }, []string{"audit.dir", "audit.keyFile"}},
		{func(a *Audit) { a.Mode = "required" }, []string{"audit.mode"}}, // without a trail
		{func(a *Audit) { a.Mode = "sometimes" }, []string{"audit.mode"}},
		{func(a *Audit) { a.SegmentMaxBytes = 10 }, []string{"audit.segmentMaxBytes"}},
		{func(a *Audit) { a.SegmentMaxAge = Duration(time.Second) }, []string{"audit.segmentMaxAge"}},
		{func(a *Audit) { a.CheckpointEvery = 0 }, []string{"audit.checkpointEvery"}},
		{func(a *Audit) { a.CheckpointInterval = 0 }, []string{"audit.checkpointInterval"}},
		{func(a *Audit) { a.BufferRecords = -1 }, []string{"audit.bufferRecords"}},
		{func(a *Audit) { a.Enabled, a.Dir, a.KeyFile = true, "/tmp/t", "/tmp/k" }, nil},
		// The collection sink alone, in the lock store's sealed database.
		{func(a *Audit) { a.Enabled, a.Collection.Name, a.KeyFile = true, "audit", "/tmp/k" }, nil},
		{func(a *Audit) { a.Collection.Database = "lockgate" }, []string{"audit.collection.name"}},
		{func(a *Audit) { a.Collection.Name = "a$b" }, []string{"audit.collection.name"}},
		{func(a *Audit) { a.Collection.Name = "locks" }, []string{"audit.collection.name"}},
		{func(a *Audit) { a.Collection.Name = "locks_claims" }, []string{"audit.collection.name"}},
		// Another database of the upstream: clients could rewrite it.
		{func(a *Audit) { a.Collection.Name, a.Collection.Database = "audit", "shop" }, []string{"audit.collection.database"}},
		{func(a *Audit) {
			a.Collection.Name, a.Collection.Database, a.Collection.URI = "audit", "shop", "mongodb://127.0.0.1:27017/"
		}, []string{"audit.collection.database"}},
		// ... unless it is a deployment of its own.
		{func(a *Audit) {
			a.Collection.Name, a.Collection.Database, a.Collection.URI = "audit", "evidence", "mongodb://audit.example:27017/"
		}, nil},
		{func(a *Audit) { a.Collection.Name, a.Collection.Database = "audit", "admin" }, []string{"audit.collection.database", "audit.collection.database"}},
	} {
		c := Default()
		tc.set(&c.Audit)
		err := c.Validate()
		var got []string
		for _, e := range flatten(err) {
			var fe *FieldError
			if errors.As(e, &fe) {
				got = append(got, fe.Key)
			}
		}
		if !reflect.DeepEqual(got, tc.keys) {
			t.Errorf("%+v: errors on %v, want %v (%v)", c.Audit, got, tc.keys, err)
		}
	}
}

func flatten(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func TestAuditRequiredRuleValidation(t *testing.T) {
	for _, tc := range []struct {
		enabled bool
		rule    NamespaceRule
		keys    []string
	}{
		{false, NamespaceRule{Match: "a.b", Mode: ModeEnforce, AuditRequired: true}, []string{"policy.namespaces[0].auditRequired"}},
		{true, NamespaceRule{Match: "a.b", Mode: ModeAudit, AuditRequired: true}, []string{"policy.namespaces[0].auditRequired"}},
		{true, NamespaceRule{Match: "a.b", Mode: ModeEnforce, AuditRequired: true, Scheme: &Scheme{Type: SchemeFlag}}, nil},
		{true, NamespaceRule{Match: "a.b", Mode: ModeEnforce, AuditRequired: true}, nil},
	} {
		c := Default()
		c.Audit.Enabled, c.Audit.Dir, c.Audit.KeyFile = tc.enabled, "/tmp/t", "/tmp/k"
		c.Policy.Namespaces = []NamespaceRule{tc.rule}
		var got []string
		for _, e := range flatten(c.Validate()) {
			var fe *FieldError
			if errors.As(e, &fe) {
				got = append(got, fe.Key)
			}
		}
		if !reflect.DeepEqual(got, tc.keys) {
			t.Errorf("enabled %v, %+v: errors on %v, want %v (%v)", tc.enabled, tc.rule, got, tc.keys, c.Validate())
		}
	}
	// audit.mode required holds on a scheme's writes too.
	c := Default()
	c.Audit.Enabled, c.Audit.Dir, c.Audit.KeyFile, c.Audit.Mode = true, "/tmp/t", "/tmp/k", AuditRequired
	c.Policy.Namespaces = []NamespaceRule{{Match: "a.b", Mode: ModeEnforce, Scheme: &Scheme{Type: SchemeFlag}}}
	if err := c.Validate(); err != nil {
		t.Errorf("audit.mode required with a scheme rule: %v", err)
	}
}
