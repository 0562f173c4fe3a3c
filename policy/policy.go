package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/namespace"
)

// Mode is how writes on a namespace are treated.
type Mode = config.Mode

// The modes, weakest first.
const (
	Off     = config.ModeOff
	Audit   = config.ModeAudit
	Enforce = config.ModeEnforce
)

// InsertMode says what an insert into a protected namespace needs.
type InsertMode = config.InsertMode

// Insert modes.
const (
	// InsertsAllow lets inserts through: a new document has no lock yet.
	InsertsAllow = config.InsertsAllow
	// InsertsRequireUnlocked refuses an insert whose _id another session
	// has locked (the lock-then-insert pattern).
	InsertsRequireUnlocked = config.InsertsRequireUnlocked
)

// DefaultMaxCandidates bounds the documents a filter that does not pin _id
// may resolve to before the write is refused.
const DefaultMaxCandidates = 1000

// Rule is the policy for one namespace.
type Rule struct {
	// Match is the rule's pattern as configured ("shop.orders", "shop.*"),
	// or "default" when no rule matched. It is the namespace's metric label:
	// the set of values is fixed by the configuration.
	Match                 string
	Mode                  Mode
	Inserts               InsertMode
	AllowCollectionWrites bool
	AllowCappedInserts    bool
	MaxCandidates         int
	// LeaseMargin is the lease a lock must have left for a write to be
	// allowed under it.
	LeaseMargin time.Duration
	// RefuseLocksOnMissingCollection: acquireLock in a collection that
	// does not exist is refused rather than granted with a warning.
	RefuseLocksOnMissingCollection bool
	// FenceField is the field that carries the lock holder's fencing
	// token when the rule sets fence: document, "" without a fence. Only
	// enforced namespaces are fenced.
	FenceField string
	// Scheme is the advisory locking convention enforced (docs/SCHEMES.md);
	// the zero value is lockgate's own lock commands.
	Scheme Scheme
	// Clients, when set, narrows Mode to some clients (ForClient).
	Clients *Clients
	// AuditRequired: an allowed write is forwarded only once its audit
	// record is durable (guard/audit.go).
	AuditRequired bool
	// Unlocked is what an enforced write from a session holding none of
	// the locks it needs gets; the zero value is config.UnlockedRefuse.
	Unlocked config.UnlockedWriters
	// UnlockedWait bounds the queueing of such a write under
	// config.UnlockedWait.
	UnlockedWait time.Duration
	// CaseOf is, for the rule of a database that is a case variant of
	// one the rules name (CaseVariantOf), that database as they spell it;
	// "" for any other. An upstream that folds database names writes the
	// protected documents under the variant, where no lock can be taken,
	// so the locks an insert must not meet are the protected namespace's
	// (LockNamespace).
	CaseOf string
}

// LockNamespace is the namespace whose locks apply to a write of ns under
// r: ns, but for a case variant of a protected database, the protected
// database's namespace of the same collection (Rule.CaseOf).
func (r *Rule) LockNamespace(ns namespace.Namespace) namespace.Namespace {
	if r.CaseOf == "" {
		return ns
	}
	_, coll := ns.Parts()
	return namespace.New(r.CaseOf, coll)
}

// Implicit reports whether a write from a session that holds none of the
// locks it needs takes implicit locks instead of being refused.
func (r *Rule) Implicit() bool {
	return r.Mode == Enforce && (r.Unlocked == config.UnlockedRefuseIfLocked || r.Unlocked == config.UnlockedWait)
}

// Policy is a compiled, immutable policy. It is safe for concurrent use;
// a reload replaces it whole.
type Policy struct {
	version  string
	fallback Rule
	exact    map[string]Rule // "db.coll"
	byDB     map[string]Rule // "db" for "db.*"
	rules    []Rule          // as configured, for the admin view
	allOff   bool
	// introspection: session-listing commands pass (allowed, or nothing
	// is enforced so there is no lock to steal).
	introspection bool
	// lockRules are the rules under a lockCollection scheme, whose lock
	// collections Lookup recognises (scheme.go).
	lockRules []Rule
	lockNS    []namespace.Namespace // lockRules[i]'s match, read once
	// ruleDBs are the databases the rules name (each once, as
	// configured), which a case variant of a database is compared with
	// (CaseVariantOf); ruleDBLens has bit n set for a name of n bytes (n
	// < 64), so that most lookups skip the comparison.
	ruleDBs    []string
	ruleDBLens uint64
}

// Compile checks and compiles the policy part of a configuration. The
// configuration is expected to have passed config.Validate; Compile still
// refuses what it cannot use.
func Compile(c config.Policy) (*Policy, error) {
	return CompileWithLease(c, 0)
}

// CompileWithLease is Compile with the lock store's default lease, which
// a flag scheme without leaseMS uses.
func CompileWithLease(c config.Policy, defaultLeaseMS int64) (*Policy, error) {
	p := &Policy{
		exact: make(map[string]Rule),
		byDB:  make(map[string]Rule),
	}
	base := Rule{
		// An insert of an _id another session has locked is refused
		// unless a rule says inserts: allow: lock-then-upsert is the
		// documented way to create a document, and an intruder's insert
		// would defeat it.
		Inserts:       InsertsRequireUnlocked,
		MaxCandidates: DefaultMaxCandidates,
		LeaseMargin:   time.Duration(c.LeaseMarginMS) * time.Millisecond,
		Unlocked:      config.UnlockedRefuse,
		UnlockedWait:  config.DefaultUnlockedWaitMS * time.Millisecond,
	}
	if c.MaxCandidates > 0 {
		base.MaxCandidates = c.MaxCandidates
	}
	if !c.Default.Valid() {
		return nil, fmt.Errorf("policy.default: unknown mode %q", c.Default)
	}
	p.fallback = base
	p.fallback.Match, p.fallback.Mode = "default", c.Default
	for i, nr := range c.Namespaces {
		key := fmt.Sprintf("policy.namespaces[%d]", i)
		if !nr.Mode.Valid() {
			return nil, fmt.Errorf("%s.mode: unknown mode %q", key, nr.Mode)
		}
		r := base
		r.Match, r.Mode = nr.Match, nr.Mode
		if nr.Inserts != "" {
			r.Inserts = nr.Inserts
		}
		r.AllowCollectionWrites = nr.AllowCollectionWrites
		r.AllowCappedInserts = nr.AllowCappedInserts
		r.RefuseLocksOnMissingCollection = nr.RefuseLocksOnMissingCollection
		r.AuditRequired = nr.AuditRequired
		r.Scheme = compileScheme(nr.Scheme, defaultLeaseMS)
		r.Clients = compileClients(nr.Clients, nr.OtherClients, nr.OtherClientsUnlockedWriters)
		r.Unlocked = nr.UnlockedWriters
		if r.Unlocked == "" {
			r.Unlocked = config.UnlockedRefuse
		}
		if nr.UnlockedWriters != "" && !nr.UnlockedWriters.Valid() {
			return nil, fmt.Errorf("%s.unlockedWriters: unknown value %q", key, nr.UnlockedWriters)
		}
		r.UnlockedWait = time.Duration(nr.UnlockedWaitMS) * time.Millisecond
		if nr.UnlockedWaitMS <= 0 {
			r.UnlockedWait = config.DefaultUnlockedWaitMS * time.Millisecond
		}
		if nr.MaxCandidates > 0 {
			r.MaxCandidates = nr.MaxCandidates
		}
		if nr.Fence == config.FenceDocument {
			r.FenceField = nr.FenceField
			if r.FenceField == "" {
				r.FenceField = config.DefaultFenceField
			}
		}
		n, ok := namespace.Parse(nr.Match)
		db, coll := n.Parts()
		if !ok {
			return nil, fmt.Errorf("%s.match: want \"db.coll\" or \"db.*\", got %q", key, nr.Match)
		}
		if coll == "*" {
			if _, dup := p.byDB[db]; dup {
				return nil, fmt.Errorf("%s.match: %q appears twice", key, nr.Match)
			}
			p.byDB[db] = r
		} else {
			if _, dup := p.exact[nr.Match]; dup {
				return nil, fmt.Errorf("%s.match: %q appears twice", key, nr.Match)
			}
			p.exact[nr.Match] = r
		}
		p.rules = append(p.rules, r)
		if !slices.Contains(p.ruleDBs, db) {
			p.ruleDBs = append(p.ruleDBs, db)
			if len(db) < 64 {
				p.ruleDBLens |= 1 << len(db)
			}
		}
		if r.Scheme.Type == config.SchemeLockCollection {
			p.lockRules = append(p.lockRules, r)
			p.lockNS = append(p.lockNS, n)
		}
	}
	p.allOff = p.fallback.Mode == Off
	for _, r := range p.rules {
		if r.Mode != Off || (r.Clients != nil && r.Clients.Others != Off) {
			p.allOff = false
		}
	}
	enforced := p.fallback.Mode == Enforce
	for _, r := range p.rules {
		enforced = enforced || r.Mode == Enforce || (r.Clients != nil && r.Clients.Others == Enforce)
	}
	p.introspection = c.AllowSessionIntrospection || !enforced
	p.version = fingerprint(c, p)
	return p, nil
}

// SessionIntrospection reports whether commands that reveal other
// sessions' ids may pass: when the operator allows them, or when no
// namespace is enforced.
func (p *Policy) SessionIntrospection() bool { return p.introspection }

// fingerprint names a policy by its content, so that the version in every
// decision log line identifies exactly which rules decided.
func fingerprint(c config.Policy, p *Policy) string {
	h := sha256.New()
	fmt.Fprintf(h, "%+v|%v|", p.fallback, c.AllowSessionIntrospection)
	for _, r := range p.rules {
		rc := r
		rc.Clients = nil // a pointer: its content, not its address, names the policy
		fmt.Fprintf(h, "%+v|", rc)
		if r.Clients != nil {
			fmt.Fprintf(h, "%+v|", *r.Clients)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// AllOff reports whether no namespace is audited or enforced, so that
// requests need no classification at all.
func (p *Policy) AllOff() bool { return p.allOff }

// Version identifies the policy's content.
func (p *Policy) Version() string { return p.version }

// Rules returns the configured rules and the default, for the admin view.
func (p *Policy) Rules() (rules []Rule, fallback Rule) {
	return append([]Rule(nil), p.rules...), p.fallback
}

// Lookup returns the rule for a namespace "db.coll": an exact rule, else
// the rule of its database, else the default. A namespace "db.*" (a write
// that touches a whole database) gets the strictest rule of that database,
// "*" the strictest of all.
//
// A database no rule names whose name differs from one a rule names only
// in ASCII case ("SHOP" beside rules on "shop") gets the rule of that
// spelling, without implicit locks (CaseVariantOf): an upstream that keeps
// databases on a case-insensitive file system (FerretDB with SQLite on
// macOS or Windows) opens shop's files for "SHOP", so a write there lands
// on the protected documents. MongoDB refuses such a database while the
// other exists (DatabaseDifferCase), so nothing legitimate is refused.
// Collections are compared exactly: no upstream folds their names.
//
// Rules are keyed by the namespace's text (String), which a lookup reads
// without building it.
func (p *Policy) Lookup(n namespace.Namespace) Rule {
	ns := n.String()
	if len(p.lockRules) > 0 && strings.IndexByte(ns, '.') >= 0 {
		if r, ok := p.lockSide(n); ok {
			return r
		}
	}
	if r, ok := p.exact[ns]; ok {
		return r
	}
	if ns == namespace.Any {
		return p.strictestIn("")
	}
	db, coll := n.Parts()
	// A database no rule names would get the default, unless it is a case
	// variant of one a rule names.
	if spelled, ok := p.CaseVariantOf(db); ok {
		return p.lookupVariant(spelled, coll)
	}
	if strings.HasPrefix(coll, "system.buckets.") {
		return p.lookupIn(db, coll)
	}
	return p.lookupColl(db, coll)
}

// lookupVariant is Lookup of spelled.coll for a case variant of spelled.
// It and lookupIn are apart from Lookup so that the rules they copy do
// not weigh on every lookup's frame (inline, they cost 20 ns more a
// lookup of a namespace no rule names).
//
//go:noinline
func (p *Policy) lookupVariant(spelled, coll string) Rule {
	if len(p.lockRules) > 0 {
		if r, ok := p.lockSide(namespace.New(spelled, coll)); ok {
			return caseVariantRule(r, spelled)
		}
	}
	return caseVariantRule(p.lookupIn(spelled, coll), spelled)
}

// lookupIn is lookupColl with time-series buckets read as their
// collection.
func (p *Policy) lookupIn(db, coll string) Rule {
	if base, ok := strings.CutPrefix(coll, "system.buckets."); ok {
		// A time-series collection keeps its documents in its buckets
		// collection; writing there directly writes the protected data.
		own := p.lookupColl(db, coll)
		if viaBase := p.lookupColl(db, base); stricter(viaBase, own) {
			return viaBase
		}
		return own
	}
	return p.lookupColl(db, coll)
}

func (p *Policy) lookupColl(db, coll string) Rule {
	if r, ok := p.exact[db+"."+coll]; ok {
		return r
	}
	if coll == "*" {
		return p.strictestIn(db)
	}
	if r, ok := p.byDB[db]; ok {
		return r
	}
	return p.fallback
}

// CaseVariantOf reports whether no rule names database db but one names
// a database whose name equals db under ASCII case folding, and returns
// that database as the rules spell it. Lock commands there are refused
// (a lock on "SHOP.orders" is no lock on "shop.orders", which an upstream
// that folds database names writes under it).
func (p *Policy) CaseVariantOf(db string) (string, bool) {
	if len(db) < 64 && p.ruleDBLens&(1<<len(db)) == 0 {
		return "", false // no rule's database is as long
	}
	var found string
	for _, d := range p.ruleDBs {
		if d == db {
			return "", false
		}
		if found == "" && asciiFoldEqual(d, db) {
			found = d
		}
	}
	return found, found != ""
}

// caseVariantRule is r for a case variant of its database, spelled as
// the rules spell it: no implicit lock, as one taken under the variant's
// name would not exclude the holders of the protected documents' locks,
// and inserts checked against those holders' locks (CaseOf).
func caseVariantRule(r Rule, spelled string) Rule {
	r.CaseOf = spelled
	if r.Implicit() {
		r.Unlocked = config.UnlockedRefuse
	}
	if r.Clients != nil {
		c := *r.Clients
		c.OthersUnlocked = config.UnlockedRefuse
		r.Clients = &c
	}
	return r
}

// strictestIn is the rule of the most protected namespace of db ("" for
// every database), since a database-wide write touches all of them.
func (p *Policy) strictestIn(db string) Rule {
	best := p.fallback
	for d, r := range p.byDB {
		if (db == "" || d == db) && stricter(r, best) {
			best = r
		}
	}
	for ns, r := range p.exact {
		if (db == "" || strings.HasPrefix(ns, db+".")) && stricter(r, best) {
			best = r
		}
	}
	return best
}

func stricter(a, b Rule) bool {
	if rank(a.Mode) != rank(b.Mode) {
		return rank(a.Mode) > rank(b.Mode)
	}
	return !a.AllowCollectionWrites && b.AllowCollectionWrites
}

func rank(m Mode) int {
	switch m {
	case Enforce:
		return 2
	case Audit:
		return 1
	}
	return 0
}
