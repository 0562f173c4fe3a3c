package config

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/lockgate/lockgate/namespace"
)

// Bounds enforced by Validate. They are wide enough for any sane deployment
// and narrow enough to catch unit mistakes (seconds typed as milliseconds).
const (
	// MinMaxMessageSizeBytes is the smallest message that can still carry
	// one maximum-size BSON document (16 MiB) plus MongoDB's 16 KiB of
	// command overhead; a lower limit would break legitimate writes.
	MinMaxMessageSizeBytes = 16*1024*1024 + 16*1024
	// MaxMaxMessageSizeBytes is MongoDB's own maxMessageSizeBytes; the
	// server refuses anything larger, so buffering more buys nothing.
	MaxMaxMessageSizeBytes = 48000000
	// MaxLeaseLimitMS caps lockstore.maxLeaseMS at one day: a longer lease
	// outlives any crash it is meant to survive.
	MaxLeaseLimitMS = 24 * 60 * 60 * 1000
	// MaxShutdownTimeout and MaxDialTimeout bound waits an orchestrator
	// would kill us long before anyway.
	MaxShutdownTimeout = 10 * time.Minute
	MaxDialTimeout     = 5 * time.Minute
)

// FieldError is one invalid setting: the dotted key and why.
type FieldError struct {
	Key    string
	Reason string
}

func (e *FieldError) Error() string { return e.Key + ": " + e.Reason }

// Validate checks every setting and returns all problems at once (joined
// *FieldError values, one per line), so a bad file is fixed in one pass.
// It checks shape only: files named by tls.* are opened at start, and URIs
// are not resolved.
func (c *Config) Validate() error {
	var v validator
	v.addr("listen", c.Listen)
	v.addr("admin", c.Admin)
	if c.Listen != "" && c.Listen == c.Admin && !strings.HasSuffix(c.Listen, ":0") {
		v.add("admin", "must differ from listen (%s)", c.Listen)
	}
	c.validateTLS(&v)

	v.uri("upstream.uri", c.Upstream.URI, false)
	v.duration("upstream.dialTimeout", c.Upstream.DialTimeout, MaxDialTimeout)

	ls := c.Lockstore
	v.uri("lockstore.uri", ls.URI, true)
	if err := checkDBName(ls.Database); err != "" {
		v.add("lockstore.database", "%s, got %q", err, ls.Database)
	} else if isServerDB(ls.Database) {
		// local is not replicated (locks would diverge across a
		// failover), admin and config belong to the server, and the seal
		// of the lock store's database would refuse their commands.
		v.add("lockstore.database", "must not be one of the server's own databases (admin, config, local), got %q", ls.Database)
	}
	if err := checkCollName(ls.Collection); err != "" {
		v.add("lockstore.collection", "%s, got %q", err, ls.Collection)
	}
	if ls.WakeListen != "" {
		if h, _, err := net.SplitHostPort(ls.WakeListen); err != nil || h == "" || net.ParseIP(h) != nil && net.ParseIP(h).IsUnspecified() {
			v.add("lockstore.wakeListen", "must be host:port with the address other lockgates reach this one at (not 0.0.0.0 or ::), got %q", ls.WakeListen)
		}
	}
	if ls.TakeoverGraceMS < 0 || ls.TakeoverGraceMS > MaxLeaseLimitMS {
		v.add("lockstore.takeoverGraceMS", "must be between 0 and %d, got %d", MaxLeaseLimitMS, ls.TakeoverGraceMS)
	}
	if ls.NewcomerHorizonMS > 60000 {
		v.add("lockstore.newcomerHorizonMS", "must be at most 60000 (a lockgate joining others grants nothing for that long), got %d", ls.NewcomerHorizonMS)
	}
	if ls.MaxLeaseMS < 1 || ls.MaxLeaseMS > MaxLeaseLimitMS {
		v.add("lockstore.maxLeaseMS", "must be between 1 and %d (one day), got %d", MaxLeaseLimitMS, ls.MaxLeaseMS)
	}
	if maxLease := min(max(ls.MaxLeaseMS, 1), MaxLeaseLimitMS); ls.DefaultLeaseMS < 1 || ls.DefaultLeaseMS > maxLease {
		v.add("lockstore.defaultLeaseMS", "must be between 1 and lockstore.maxLeaseMS (%d), got %d", ls.MaxLeaseMS, ls.DefaultLeaseMS)
	}

	c.validatePolicy(&v)

	if n := c.Limits.MaxMessageSizeBytes; n < MinMaxMessageSizeBytes || n > MaxMaxMessageSizeBytes {
		v.add("limits.maxMessageSizeBytes", "must be between %d and %d, got %d", MinMaxMessageSizeBytes, MaxMaxMessageSizeBytes, n)
	}
	if n := c.Limits.ResolveTimeoutMS; n < 10 || n > 60000 {
		v.add("limits.resolveTimeoutMS", "must be between 10 and 60000 milliseconds, got %d", n)
	}
	if n := c.Limits.MaxConcurrentResolves; n < 1 || n > 1000 {
		v.add("limits.maxConcurrentResolves", "must be between 1 and 1000, got %d", n)
	}
	if n := c.Limits.MaxConnections; n < 0 || n > 1000000 {
		v.add("limits.maxConnections", "must be between 0 (derived from the file descriptor limit) and 1000000, got %d", n)
	}
	if n := c.Limits.MaxLockIDs; n < 1 || n > 100000 {
		v.add("limits.maxLockIDs", "must be between 1 and 100000, got %d", n)
	}
	if n := c.Limits.MaxWaitersPerLock; n < 1 || n > 1000000 {
		v.add("limits.maxWaitersPerLock", "must be between 1 and 1000000, got %d", n)
	}
	if n := c.Limits.MaxLocksPerSession; n < 1 || n > 10000000 {
		v.add("limits.maxLocksPerSession", "must be between 1 and 10000000, got %d", n)
	}
	if n := c.Limits.HandshakeTimeoutMS; n < 100 || n > 600000 {
		v.add("limits.handshakeTimeoutMS", "must be between 100 and 600000 milliseconds, got %d", n)
	}
	v.duration("shutdownTimeout", c.ShutdownTimeout, MaxShutdownTimeout)
	if d := c.ShutdownDrainDelay.D(); d < 0 || d > MaxShutdownTimeout {
		v.add("shutdownDrainDelay", "must be between 0 and %v, got %v", MaxShutdownTimeout, d)
	}

	c.validateAudit(&v)

	if !c.Log.Level.Valid() {
		v.add("log.level", "must be one of %s, got %q", list(LogLevels()), c.Log.Level)
	}
	if !c.Log.Format.Valid() {
		v.add("log.format", "must be one of %s, got %q", list(LogFormats()), c.Log.Format)
	}
	if d := c.Log.FlushInterval.D(); d < 0 || d > MaxLogFlushInterval {
		v.add("log.flushInterval", "must be between 0s (every line written at once) and %v, got %v", MaxLogFlushInterval, d)
	}
	return errors.Join(v.errs...)
}

func (c *Config) validateAudit(v *validator) {
	a := c.Audit
	if !a.Mode.Valid() {
		v.add("audit.mode", "must be one of %s, got %q", list(AuditModes()), a.Mode)
	}
	if a.Mode == AuditRequired && !a.Enabled {
		v.add("audit.mode", "required needs audit.enabled: true (no write may pass without a record, and there is no trail)")
	}
	for i, r := range c.Policy.Namespaces {
		if !r.AuditRequired {
			continue
		}
		key := fmt.Sprintf("policy.namespaces[%d].auditRequired", i)
		switch {
		case !a.Enabled:
			v.add(key, "needs audit.enabled: true (no write may pass without a record, and there is no trail)")
		case r.Mode != ModeEnforce:
			v.add(key, "applies to enforce rules only (an audit rule never refuses a write), got mode %q", r.Mode)
		}
	}
	if a.Enabled {
		if a.Dir == "" && a.Collection.Name == "" {
			v.add("audit.dir", "required when audit.enabled is true, unless audit.collection.name is set: the directory of this instance's trail")
		}
		if a.KeyFile == "" {
			v.add("audit.keyFile", "required when audit.enabled is true: a file of at least 32 secret bytes that signs checkpoints (openssl rand -hex 32)")
		}
	}
	c.validateAuditCollection(v)
	if n := a.SegmentMaxBytes; n < 4096 || n > 1<<40 {
		v.add("audit.segmentMaxBytes", "must be between 4096 and %d, got %d", int64(1<<40), n)
	}
	if d := a.SegmentMaxAge.D(); d < time.Minute || d > 366*24*time.Hour {
		v.add("audit.segmentMaxAge", "must be between 1m and 8784h (a year), got %q", d.String())
	}
	if n := a.CheckpointEvery; n < 1 || n > 1000000 {
		v.add("audit.checkpointEvery", "must be between 1 and 1000000 records, got %d", n)
	}
	if d := a.CheckpointInterval.D(); d < 100*time.Millisecond || d > time.Hour {
		v.add("audit.checkpointInterval", "must be between 100ms and 1h, got %q", d.String())
	}
	if n := a.BufferRecords; n < 1 || n > 10000000 {
		v.add("audit.bufferRecords", "must be between 1 and 10000000, got %d", n)
	}
}

func (c *Config) validateAuditCollection(v *validator) {
	ac, ls := c.Audit.Collection, c.Lockstore
	if ac.Name == "" {
		if ac.Database != "" || ac.URI != "" {
			v.add("audit.collection.name", "required when audit.collection.database or .uri is set")
		}
		return
	}
	if err := checkCollName(ac.Name); err != "" {
		v.add("audit.collection.name", "%s, got %q", err, ac.Name)
	}
	db := ac.DB(ls)
	if err := checkDBName(db); err != "" {
		v.add("audit.collection.database", "%s, got %q", err, db)
	} else if isServerDB(db) {
		v.add("audit.collection.database", "must not be one of the server's own databases (admin, config, local), got %q", db)
	}
	lockDB := strings.EqualFold(db, ls.Database)
	onUpstream := ac.URI == c.Upstream.URI || (ac.URI == "" && (ls.URI == "" || ls.URI == c.Upstream.URI))
	if onUpstream && !lockDB {
		v.add("audit.collection.database", "must be the lock store's database %q while the collection is on the upstream deployment (clients reach every other database of it through lockgate, and could rewrite the trail); or give it a deployment of its own (audit.collection.uri), got %q", ls.Database, db)
	}
	if lockDB && (ac.URI == "" || ac.URI == ls.URI) {
		for _, lc := range []string{ls.Collection, ls.Collection + "_claims", ls.Collection + "_txns"} {
			if strings.EqualFold(ac.Name, lc) || strings.EqualFold(ac.Name+"_head", lc) {
				v.add("audit.collection.name", "must not be one of the lock store's collections (%s), got %q", lc, ac.Name)
			}
		}
	}
}

func (c *Config) validateTLS(v *validator) {
	t := c.TLS
	if !t.ClientAuth.Valid() {
		v.add("tls.clientAuth", "must be one of %s, got %q", list(ClientAuths()), t.ClientAuth)
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		v.add("tls.keyFile", "required when tls.certFile is set")
	case t.CertFile == "" && t.KeyFile != "":
		v.add("tls.certFile", "required when tls.keyFile is set")
	}
	if !t.Enabled() && (t.CAFile != "" || (t.ClientAuth != ClientAuthNone && t.ClientAuth.Valid())) {
		v.add("tls.certFile", "required when tls.caFile or tls.clientAuth is set (client certificates need a TLS listener)")
	}
	if t.ClientAuth == ClientAuthRequireAndVerify && t.CAFile == "" {
		v.add("tls.caFile", "required when tls.clientAuth is %q: client certificates are verified against it", t.ClientAuth)
	}
}

func (c *Config) validatePolicy(v *validator) {
	if !c.Policy.Default.Valid() {
		v.add("policy.default", "must be one of %s, got %q", list(Modes()), c.Policy.Default)
	}
	seen := map[string]int{}
	for i, r := range c.Policy.Namespaces {
		key := fmt.Sprintf("policy.namespaces[%d]", i)
		if err := checkMatch(r.Match); err != "" {
			v.add(key+".match", "%s, got %q", err, r.Match)
		} else if j, dup := seen[r.Match]; dup {
			v.add(key+".match", "%q is already matched by policy.namespaces[%d]; one rule per namespace", r.Match, j)
		} else {
			seen[r.Match] = i
		}
		if !r.Mode.Valid() {
			v.add(key+".mode", "must be one of %s, got %q", list(Modes()), r.Mode)
		}
		if r.Inserts != "" && !r.Inserts.Valid() {
			v.add(key+".inserts", "must be one of %s, got %q", list(InsertModes()), r.Inserts)
		}
		if r.MaxCandidates < 0 || r.MaxCandidates > MaxMaxCandidates {
			v.add(key+".maxCandidates", "must be between 0 (use policy.maxCandidates) and %d, got %d", MaxMaxCandidates, r.MaxCandidates)
		}
		validateFence(v, key, r)
		c.validateScheme(v, key+".scheme", r.Scheme)
		c.validateSchemeRule(v, key, r)
		validateUnlocked(v, key, r)
	}
	if c.Policy.MaxCandidates < 1 || c.Policy.MaxCandidates > MaxMaxCandidates {
		v.add("policy.maxCandidates", "must be between 1 and %d, got %d", MaxMaxCandidates, c.Policy.MaxCandidates)
	}
	if c.Policy.LeaseMarginMS < 0 || c.Policy.LeaseMarginMS > MaxLeaseMarginMS {
		v.add("policy.leaseMarginMS", "must be between 0 and %d, got %d", MaxLeaseMarginMS, c.Policy.LeaseMarginMS)
	}
}

type validator struct{ errs []error }

func (v *validator) add(key, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Key: key, Reason: fmt.Sprintf(format, args...)})
}

func (v *validator) addr(key, s string) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		v.add(key, "must be host:port (\"127.0.0.1:27018\", \":27018\"), got %q", s)
		return
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		v.add(key, "port must be a number from 0 to 65535, got %q", port)
	}
	if strings.ContainsAny(host, " /") {
		v.add(key, "host %q is not a hostname or IP address", host)
	}
}

func (v *validator) uri(key, s string, emptyOK bool) {
	if s == "" {
		if !emptyOK {
			v.add(key, "required: a MongoDB connection string such as %q", DefaultUpstreamURI)
		}
		return
	}
	rest, ok := strings.CutPrefix(s, "mongodb://")
	if !ok {
		rest, ok = strings.CutPrefix(s, "mongodb+srv://")
	}
	if !ok {
		v.add(key, "must start with mongodb:// or mongodb+srv://, got %q", redact(s))
		return
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest = rest[i+1:]
	}
	hosts, _, _ := strings.Cut(rest, "/")
	hosts, _, _ = strings.Cut(hosts, "?")
	if hosts == "" {
		v.add(key, "names no host, got %q", redact(s))
	}
}

func (v *validator) duration(key string, d Duration, maxD time.Duration) {
	if d.D() <= 0 || d.D() > maxD {
		v.add(key, "must be a duration above 0s and at most %s, got %q", maxD, d.D().String())
	}
}

// redact drops credentials from a URI before it lands in an error message
// that may end up in logs.
func redact(uri string) string {
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		return uri
	}
	hostEnd := strings.IndexAny(rest, "/?")
	if hostEnd < 0 {
		hostEnd = len(rest)
	}
	if at := strings.LastIndexByte(rest[:hostEnd], '@'); at >= 0 {
		return scheme + "://REDACTED@" + rest[at+1:]
	}
	return uri
}

func list[T ~string](vs []T) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = string(v)
	}
	return strings.Join(s, ", ")
}

// MongoDB's naming rules, using the stricter cross-platform character set so
// a policy written on Linux also means something against a Windows server.
const (
	maxDBNameBytes        = 63
	maxNamespaceBytes     = 255
	invalidDBNameChars    = "/\\. \"$*<>:|?\x00"
	invalidCollNameChars  = "$\x00"
	systemCollectionsPref = "system."
)

func checkDBName(db string) string {
	switch {
	case db == "":
		return "database name must not be empty"
	case len(db) > maxDBNameBytes:
		return fmt.Sprintf("database name must be at most %d bytes", maxDBNameBytes)
	case strings.ContainsAny(db, invalidDBNameChars):
		return `database name must not contain any of / \ . space " $ * < > : | ? or NUL`
	}
	return ""
}

// isServerDB reports whether db is one of the server's own databases;
// the server compares database names case-insensitively.
func isServerDB(db string) bool {
	return strings.EqualFold(db, "admin") || strings.EqualFold(db, "config") || strings.EqualFold(db, "local")
}

func checkCollName(coll string) string {
	switch {
	case coll == "":
		return "collection name must not be empty"
	case strings.ContainsAny(coll, invalidCollNameChars):
		return "collection name must not contain $ or NUL"
	case strings.HasPrefix(coll, systemCollectionsPref):
		return "system collections cannot be used"
	}
	return ""
}

// checkMatch accepts "db.coll" and "db.*". A bare "*" is refused on
// purpose: policy.default already covers every namespace, and two ways to
// say one thing make "which rule applied?" harder to answer in an audit.
func checkMatch(m string) string {
	const want = `must be "db.collection" or "db.*"`
	if m == "*" {
		return want + " (use policy.default for every namespace)"
	}
	n, ok := namespace.Split(m)
	db, coll := n.Parts()
	if !ok {
		return want
	}
	if err := checkDBName(db); err != "" {
		return want + ": " + err
	}
	if coll == "*" {
		return ""
	}
	if strings.Contains(coll, "*") {
		return want + ": a wildcard must be the whole collection part"
	}
	if err := checkCollName(coll); err != "" {
		return want + ": " + err
	}
	if len(m) > maxNamespaceBytes {
		return fmt.Sprintf("%s: namespace must be at most %d bytes", want, maxNamespaceBytes)
	}
	return ""
}
