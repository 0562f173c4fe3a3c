package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the whole of lockgate's configuration. The yaml tags are the
// file's keys; config.example.yaml documents every one of them and a test
// keeps the two in step.
type Config struct {
	// Listen is the host:port clients connect to.
	Listen string `yaml:"listen"`
	// Admin is the host:port of the HTTP listener for metrics, health and
	// read-only views.
	Admin string `yaml:"admin"`
	// AdminAuth guards the admin listener's operator actions.
	AdminAuth AdminAuth `yaml:"adminAuth"`
	// TLS secures the client listener; empty certFile means plain TCP.
	TLS TLS `yaml:"tls"`
	// Upstream is the deployment client connections are relayed to.
	Upstream Upstream `yaml:"upstream"`
	// Lockstore is where lock records live.
	Lockstore Lockstore `yaml:"lockstore"`
	// Policy says which namespaces are protected and how.
	Policy Policy `yaml:"policy"`
	// Limits bound what a peer may send.
	Limits Limits `yaml:"limits"`
	// ShutdownTimeout bounds a graceful shutdown, from the signal to exit.
	ShutdownTimeout Duration `yaml:"shutdownTimeout"`
	// Log configures the process logger.
	Log Log `yaml:"log"`
	// Audit configures the tamper-evident audit trail (docs/AUDIT.md).
	Audit Audit `yaml:"audit"`
	// ShutdownDrainDelay is how long, after SIGTERM, lockgate keeps serving
	// while /readyz already reports "draining", before the graceful
	// shutdown (ShutdownTimeout) starts: time for endpoints and load
	// balancers to stop sending new clients. 0 starts the shutdown at once.
	ShutdownDrainDelay Duration `yaml:"shutdownDrainDelay"`
}

// AdminAuth guards operator actions on the admin listener (force-releasing
// a stuck lock). Without a token they are disabled.
type AdminAuth struct {
	// TokenFile holds the bearer token operators must present; leading and
	// trailing white space is ignored. Empty disables operator actions.
	TokenFile string `yaml:"tokenFile"`
}

// TLS configures TLS on the client listener.
type TLS struct {
	// CertFile and KeyFile are PEM files of the proxy's certificate chain
	// and private key. Both or neither.
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
	// CAFile is a PEM bundle of the CAs that sign client certificates.
	CAFile string `yaml:"caFile"`
	// ClientAuth says whether clients must present a certificate.
	ClientAuth ClientAuth `yaml:"clientAuth"`
}

// Enabled reports whether the client listener speaks TLS.
func (t TLS) Enabled() bool { return t.CertFile != "" }

// Upstream configures the relayed deployment.
type Upstream struct {
	// URI is a MongoDB connection string (mongodb:// or mongodb+srv://).
	URI string `yaml:"uri"`
	// DialTimeout bounds opening one upstream connection for one client.
	DialTimeout Duration `yaml:"dialTimeout"`
}

// Lockstore configures where lock records are kept.
type Lockstore struct {
	// URI is the lockstore's connection string; empty means the upstream's.
	URI        string `yaml:"uri"`
	Database   string `yaml:"database"`
	Collection string `yaml:"collection"`
	// DefaultLeaseMS is the lease of an acquireLock that names none.
	DefaultLeaseMS int64 `yaml:"defaultLeaseMS"`
	// MaxLeaseMS caps any requested lease.
	MaxLeaseMS int64 `yaml:"maxLeaseMS"`
	// OwnerSecretFile holds the secret that keys the hash under which lock
	// owners are stored (never the session id itself). Every lockgate that
	// shares a lock store must use the same secret. Empty: a random secret
	// per process.
	OwnerSecretFile string `yaml:"ownerSecretFile"`
	// OwnerSecret is the secret itself, from LOCKGATE_OWNER_SECRET only
	// (never from the file, which operators share and print); it wins
	// over OwnerSecretFile.
	OwnerSecret string `yaml:"-"`
	// TakeoverGraceMS delays granting a lock whose lease ended without a
	// release (its holder or its proxy vanished) to a new owner, so that a
	// write the database may still be running under the old lease ends
	// first (docs/ENFORCEMENT.md, "Writes in flight"). 0: none.
	TakeoverGraceMS int64 `yaml:"takeoverGraceMS"`
	// NewcomerHorizonMS is how long a lockgate that starts beside others
	// on the lock store grants nothing; it lets a lockgate alone on the
	// lock store hold legacy writes' implicit locks in memory
	// (docs/ENFORCEMENT.md, "Writers that hold no lock"). 0: 3000;
	// negative: no memory locks (the wait is then the cache's second).
	NewcomerHorizonMS int64 `yaml:"newcomerHorizonMS"`
	// WakeListen, when set, is the UDP host:port where this lockgate
	// takes wake-up datagrams from other lockgates sharing the lock store,
	// and which it advertises to them: a release through one then wakes a
	// waiter on another at once instead of at its next poll (docs/LOCKS.md,
	// "Waking waiters on other lockgates"). The host must be the address
	// the others reach this one at; port 0 picks a free port. Empty: off
	// (waiters on other lockgates poll, within 50 ms).
	WakeListen string `yaml:"wakeListen"`
}

// Policy is the static part of the enforcement policy.
type Policy struct {
	// Default is the mode of namespaces that no rule matches.
	Default Mode `yaml:"default"`
	// MaxCandidates bounds how many documents one statement may touch:
	// the _id values its filter names, or the documents a filter that
	// names none resolves to; more and the write is refused. Rules may
	// lower or raise it.
	MaxCandidates int `yaml:"maxCandidates"`
	// LeaseMarginMS is the lease a lock must have left for a write under
	// it to be allowed, so a lease cannot run out between check and write.
	LeaseMarginMS int64 `yaml:"leaseMarginMS"`
	// Namespaces are per-namespace rules; the most specific match wins.
	Namespaces []NamespaceRule `yaml:"namespaces"`
	// AllowSessionIntrospection lets commands that list other clients'
	// logical session ids (currentOp, $currentOp, $listSessions,
	// $listLocalSessions, config.system.sessions, killing other sessions)
	// through while a namespace is enforced. Off by default: on a
	// deployment without authentication a listed lsid could be replayed
	// to write as its lock holder (docs/SECURITY.md).
	AllowSessionIntrospection bool `yaml:"allowSessionIntrospection"`
}

// NamespaceRule sets the mode of one namespace or one database.
type NamespaceRule struct {
	// Match is "db.coll" (exact) or "db.*" (every collection of db).
	Match string `yaml:"match"`
	Mode  Mode   `yaml:"mode"`
	// Inserts says what an insert needs; empty means InsertsRequireUnlocked.
	Inserts InsertMode `yaml:"inserts"`
	// AllowCollectionWrites lets drop, renameCollection, $out/$merge,
	// mapReduce output and applyOps through on an enforced namespace.
	AllowCollectionWrites bool `yaml:"allowCollectionWrites"`
	// MaxCandidates overrides policy.maxCandidates; 0 keeps it.
	MaxCandidates int `yaml:"maxCandidates"`
	// AllowCappedInserts lets inserts (and inserting upserts) into a
	// capped collection through on an enforced namespace, although each
	// may evict the oldest documents, locked ones included.
	AllowCappedInserts bool `yaml:"allowCappedInserts"`
	// RefuseLocksOnMissingCollection refuses acquireLock in a collection
	// of this rule that does not exist (a misspelt name), which is
	// otherwise granted with a warning.
	RefuseLocksOnMissingCollection bool `yaml:"refuseLocksOnMissingCollection"`
	// Fence is FenceDocument to stamp each locked document with its
	// holder's fencing token and make every enforced write apply only
	// where the stamp is the writer's (docs/ENFORCEMENT.md, "Document
	// fence"); empty or FenceNone for none.
	Fence FenceMode `yaml:"fence"`
	// FenceField is the document field that carries the stamp; empty
	// means DefaultFenceField.
	FenceField string `yaml:"fenceField"`
	// Scheme is the advisory locking convention enforced on the namespace;
	// nil means lockgate's own lock commands (docs/SCHEMES.md).
	Scheme *Scheme `yaml:"scheme"`
	// Clients narrows the rule's mode to some clients; OtherClients
	// (default audit) is the mode for the rest.
	Clients      *Clients `yaml:"clients"`
	OtherClients Mode     `yaml:"otherClients"`
	// UnlockedWriters is what an enforced write from a session that holds
	// none of the locks it needs gets (docs/ENFORCEMENT.md, "Writers that
	// hold no lock"); empty means UnlockedRefuse. With clients it applies
	// to the clients named, OtherClientsUnlockedWriters (default refuse)
	// to the rest.
	UnlockedWriters             UnlockedWriters `yaml:"unlockedWriters"`
	OtherClientsUnlockedWriters UnlockedWriters `yaml:"otherClientsUnlockedWriters"`
	// UnlockedWaitMS bounds how long a write under UnlockedWait queues
	// for its implicit locks; 0 means DefaultUnlockedWaitMS.
	UnlockedWaitMS int64 `yaml:"unlockedWaitMS"`
	// AuditRequired forwards an allowed write on this (enforced) rule only
	// once its audit record is durable, and refuses it when the trail
	// cannot take it (docs/AUDIT.md); needs audit.enabled.
	AuditRequired bool `yaml:"auditRequired"`
}

// Limits bound message sizes.
type Limits struct {
	// MaxMessageSizeBytes bounds one wire message in either direction.
	MaxMessageSizeBytes int `yaml:"maxMessageSizeBytes"`
	// ResolveTimeoutMS bounds the resolution of a write whose filter names
	// no _id (the wait for a slot included); the write is refused when it
	// runs out.
	ResolveTimeoutMS int64 `yaml:"resolveTimeoutMS"`
	// MaxConcurrentResolves bounds the resolutions running at once.
	MaxConcurrentResolves int `yaml:"maxConcurrentResolves"`
	// MaxConnections bounds the open client connections; 0 derives it
	// from the file descriptor limit.
	MaxConnections int `yaml:"maxConnections"`
	// HandshakeTimeoutMS closes a client that sends nothing for this long
	// after connecting.
	HandshakeTimeoutMS int64 `yaml:"handshakeTimeoutMS"`
	// MaxLockIDs bounds the ids of one lock command.
	MaxLockIDs int `yaml:"maxLockIDs"`
	// MaxWaitersPerLock bounds the acquires waiting for one lock on this
	// instance.
	MaxWaitersPerLock int `yaml:"maxWaitersPerLock"`
	// MaxLocksPerSession bounds the unexpired locks one session may hold
	// through this instance.
	MaxLocksPerSession int `yaml:"maxLocksPerSession"`
}

// Audit configures the tamper-evident audit trail: a hash-chained,
// signed record of every decision on audited and enforced namespaces, of
// lock commands and of policy reloads, in JSON-lines files
// (docs/AUDIT.md). The decision log on stdout stays as it is.
type Audit struct {
	// Enabled turns the trail on.
	Enabled bool `yaml:"enabled"`
	// Dir holds this instance's trail files (the file sink); one lockgate
	// per directory. Empty: no file sink.
	Dir string `yaml:"dir"`
	// Collection is the MongoDB collection sink; both sinks may be on.
	Collection AuditCollection `yaml:"collection"`
	// Instance names this lockgate in every record; empty means the host
	// name.
	Instance string `yaml:"instance"`
	// KeyFile holds the key that signs checkpoints: an HMAC secret (at
	// least 32 bytes) or an Ed25519 private key (PEM, PKCS #8).
	KeyFile string `yaml:"keyFile"`
	// Mode is the durability mode.
	Mode AuditMode `yaml:"mode"`
	// SegmentMaxBytes and SegmentMaxAge start a new segment file once the
	// current one is this large or this old.
	SegmentMaxBytes int64    `yaml:"segmentMaxBytes"`
	SegmentMaxAge   Duration `yaml:"segmentMaxAge"`
	// CheckpointEvery and CheckpointInterval: a signed checkpoint follows
	// this many records, or this much time after the first unsigned one.
	CheckpointEvery    int      `yaml:"checkpointEvery"`
	CheckpointInterval Duration `yaml:"checkpointInterval"`
	// BufferRecords bounds the records waiting to be written; when it is
	// full, records are dropped (counted, and noted in the trail), never
	// writes delayed.
	BufferRecords int `yaml:"bufferRecords"`
}

// AuditCollection is the audit trail's collection sink: one document per
// record, in the lock store's sealed database or at a deployment of its
// own.
type AuditCollection struct {
	// Name is the collection's; empty: no collection sink.
	Name string `yaml:"name"`
	// Database holds it; empty: lockstore.database.
	Database string `yaml:"database"`
	// URI is a deployment of its own, with its own credentials; empty:
	// the lock store's deployment. On the upstream deployment the
	// collection must be in the lock store's database, which clients
	// cannot reach through lockgate.
	URI string `yaml:"uri"`
}

// DB is the collection's database: Database, or the lock store's.
func (c AuditCollection) DB(ls Lockstore) string {
	if c.Database != "" {
		return c.Database
	}
	return ls.Database
}

// AuditMode is the audit trail's durability mode.
type AuditMode string

const (
	// AuditBestEffort writes records in batches off the request path;
	// only rules with auditRequired wait for theirs.
	AuditBestEffort AuditMode = "bestEffort"
	// AuditRequired makes every enforced write wait for its record, as
	// auditRequired does for one rule.
	AuditRequired AuditMode = "required"
)

// AuditModes lists the valid audit modes.
func AuditModes() []AuditMode { return []AuditMode{AuditBestEffort, AuditRequired} }

// Valid reports whether m is one of AuditModes.
func (m AuditMode) Valid() bool { return slices.Contains(AuditModes(), m) }

// Log configures the process logger.
type Log struct {
	Level  LogLevel  `yaml:"level"`
	Format LogFormat `yaml:"format"`
	// FlushInterval, above 0, buffers the log's output and writes it at
	// most this long after a line, when the buffer fills, at a line of
	// level warn or above, and at shutdown: one write(2) for many
	// decision lines instead of one each. A process killed outright loses
	// what was buffered. 0, the default, writes every line at once.
	FlushInterval Duration `yaml:"flushInterval"`
}

// Defaults; exported where other packages or docs need to agree with them.
const (
	DefaultListen               = "127.0.0.1:27018"
	DefaultAdmin                = "127.0.0.1:9218"
	DefaultUpstreamURI          = "mongodb://127.0.0.1:27017/"
	DefaultMaxMessageSizeBytes  = 48000000
	DefaultMaxCandidates        = 1000
	MaxMaxCandidates            = 100000
	DefaultLeaseMarginMS        = 1000
	MaxLeaseMarginMS            = 600000
	DefaultResolveTimeoutMS     = 2000
	DefaultMaxResolves          = 8
	DefaultHandshakeTimeoutMS   = 10000
	DefaultAuditSegmentMaxBytes = 64 << 20
	MaxLogFlushInterval         = 10 * time.Second
)

// Default returns the configuration used for every key the file omits.
func Default() *Config {
	return &Config{
		Listen: DefaultListen,
		Admin:  DefaultAdmin,
		TLS:    TLS{ClientAuth: ClientAuthNone},
		Upstream: Upstream{
			URI:         DefaultUpstreamURI,
			DialTimeout: Duration(10 * time.Second),
		},
		Lockstore: Lockstore{
			Database:          "lockgate",
			Collection:        "locks",
			DefaultLeaseMS:    30000,
			NewcomerHorizonMS: 3000,
			MaxLeaseMS:        600000,
		},
		Policy: Policy{Default: ModeOff, MaxCandidates: DefaultMaxCandidates, LeaseMarginMS: DefaultLeaseMarginMS},
		Limits: Limits{MaxMessageSizeBytes: DefaultMaxMessageSizeBytes,
			ResolveTimeoutMS: DefaultResolveTimeoutMS, MaxConcurrentResolves: DefaultMaxResolves,
			HandshakeTimeoutMS: DefaultHandshakeTimeoutMS, MaxLockIDs: 1000, MaxWaitersPerLock: 1000,
			MaxLocksPerSession: 10000},
		ShutdownTimeout: Duration(15 * time.Second),
		Log:             Log{Level: LogLevelInfo, Format: LogFormatJSON},
		Audit: Audit{Mode: AuditBestEffort, SegmentMaxBytes: DefaultAuditSegmentMaxBytes,
			SegmentMaxAge: Duration(24 * time.Hour), CheckpointEvery: 1000,
			CheckpointInterval: Duration(10 * time.Second), BufferRecords: 8192},
	}
}

// Parse decodes a YAML document over Default. Unknown keys, values of the
// wrong type and more than one document are refused with the line and key.
// Parse does not call Validate: the caller applies env and flags first.
func Parse(data []byte) (*Config, error) {
	cfg := Default()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(cfg)
	switch {
	case errors.Is(err, io.EOF):
		// An empty file (or one of comments only) means all defaults.
		return cfg, nil
	case err != nil:
		return nil, explainYAMLError(data, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		// A second document would otherwise be silently ignored; an
		// operator who concatenated two files deserves to know.
		return nil, errors.New("config: more than one YAML document; lockgate reads exactly one")
	}
	return cfg, nil
}

// Load reads and parses the file at path. Errors carry the path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// Overrides are the settings a container or a command line may set without
// a file. An empty field leaves the setting alone.
type Overrides struct {
	Listen       string
	Admin        string
	UpstreamURI  string
	LockstoreURI string
	LogLevel     string
}

// Environment variables read by ApplyEnv.
const (
	EnvListen       = "LOCKGATE_LISTEN"
	EnvAdmin        = "LOCKGATE_ADMIN"
	EnvUpstreamURI  = "LOCKGATE_UPSTREAM_URI"
	EnvLockstoreURI = "LOCKGATE_LOCKSTORE_URI"
	EnvLogLevel     = "LOCKGATE_LOG_LEVEL"
	EnvAdminToken   = "LOCKGATE_ADMIN_TOKEN_FILE"
	EnvOwnerSecret  = "LOCKGATE_OWNER_SECRET_FILE"
	// EnvOwnerSecretValue carries the owner secret itself, for platforms
	// that hand secrets over as environment variables.
	EnvOwnerSecretValue = "LOCKGATE_OWNER_SECRET"
)

// ApplyEnv applies the LOCKGATE_* variables that getenv returns non-empty.
// getenv is injected (os.Getenv in binaries) so tests need not touch the
// process environment.
func (c *Config) ApplyEnv(getenv func(string) string) {
	c.Apply(Overrides{
		Listen:       getenv(EnvListen),
		Admin:        getenv(EnvAdmin),
		UpstreamURI:  getenv(EnvUpstreamURI),
		LockstoreURI: getenv(EnvLockstoreURI),
		LogLevel:     getenv(EnvLogLevel),
	})
	if f := getenv(EnvAdminToken); f != "" {
		c.AdminAuth.TokenFile = f
	}
	if f := getenv(EnvOwnerSecret); f != "" {
		c.Lockstore.OwnerSecretFile = f
	}
	if v := getenv(EnvOwnerSecretValue); v != "" {
		c.Lockstore.OwnerSecret = v
	}
}

// Apply sets every non-empty field of o. Binaries call it with their flags
// after ApplyEnv, which gives flags the last word.
func (c *Config) Apply(o Overrides) {
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&c.Listen, o.Listen)
	set(&c.Admin, o.Admin)
	set(&c.Upstream.URI, o.UpstreamURI)
	set(&c.Lockstore.URI, o.LockstoreURI)
	if o.LogLevel != "" {
		c.Log.Level = LogLevel(o.LogLevel)
	}
}
