package config

import (
	"fmt"
	"net"
	"slices"
	"strings"
)

// SchemeType names the locking convention a namespace rule enforces.
type SchemeType string

const (
	// SchemeLockgate is lockgate's own lock commands (acquireLock and
	// friends); the default.
	SchemeLockgate SchemeType = "lockgate"
	// SchemeHolderFields is a holder id and a lock time on the document
	// (LockId + LockTime), with a lease the application measures.
	SchemeHolderFields SchemeType = "holderFields"
	// SchemeLockDocument is a lock sub-document with an actor and an
	// absolute expiry (Lock: {actor, expiresAt, error}).
	SchemeLockDocument SchemeType = "lockDocument"
	// SchemeFlag is a boolean field (locked: true/false).
	SchemeFlag SchemeType = "flag"
	// SchemeLockCollection is a separate lock collection: a record
	// {_id: <document _id>, ts, aid} per locked document.
	SchemeLockCollection SchemeType = "lockCollection"
)

// SchemeTypes lists the scheme types Validate accepts.
func SchemeTypes() []SchemeType {
	return []SchemeType{SchemeLockgate, SchemeHolderFields, SchemeLockDocument, SchemeFlag, SchemeLockCollection}
}

// Valid reports whether t is one of SchemeTypes.
func (t SchemeType) Valid() bool { return slices.Contains(SchemeTypes(), t) }

// SchemeHolder is whom lockgate treats as the holder of a flag lock,
// whose writes carry no holder value.
type SchemeHolder string

const (
	// SchemeHolderClient: the client's application name, its network
	// address without the port, and its authenticated user. Every
	// connection of one application process is one holder.
	SchemeHolderClient SchemeHolder = "client"
	// SchemeHolderSession: the logical session (lsid) and user of the
	// acquiring write, as for lockgate's own locks; needs explicit
	// sessions in the application.
	SchemeHolderSession SchemeHolder = "session"
)

// SchemeHolders lists the valid SchemeHolder values.
func SchemeHolders() []SchemeHolder { return []SchemeHolder{SchemeHolderClient, SchemeHolderSession} }

// Valid reports whether h is one of SchemeHolders.
func (h SchemeHolder) Valid() bool { return slices.Contains(SchemeHolders(), h) }

// Scheme is the advisory locking convention of a namespace rule
// (docs/SCHEMES.md). Field names have defaults per type.
type Scheme struct {
	Type SchemeType `yaml:"type"`
	// Field is the lock field: the holder id (holderFields, default
	// "LockId"), the lock sub-document (lockDocument, default "Lock") or
	// the flag (flag, default "locked").
	Field string `yaml:"field"`
	// TimeField is holderFields' lock time (default "LockTime").
	TimeField string `yaml:"timeField"`
	// ActorField and ExpiresField name lockDocument's holder and absolute
	// expiry inside Field (defaults "actor", "expiresAt").
	ActorField   string `yaml:"actorField"`
	ExpiresField string `yaml:"expiresField"`
	// HolderField is lockDocument's field inside Field whose value
	// identifies the holder, the value a holder's writes name in their
	// filter (default ActorField). Tharga.MongoDB's is "LockKey": its
	// actor is a display name, its key a per-lock GUID.
	HolderField string `yaml:"holderField"`
	// LeaseMS is how long a lock lives without a renewing write:
	// holderFields' lock timeout (required: it must equal the
	// application's), and flag's lease (default lockstore.defaultLeaseMS).
	LeaseMS int64 `yaml:"leaseMS"`
	// Holder is who holds a flag or lock-collection lock (default client).
	Holder SchemeHolder `yaml:"holder"`
	// Collection is lockCollection's lock collection, in the rule's
	// database; default "<collection>.lock" next to each collection.
	Collection string `yaml:"collection"`
	// TsField and AidField name a lock record's timestamp and holder id
	// (defaults "ts", "aid").
	TsField  string `yaml:"tsField"`
	AidField string `yaml:"aidField"`
	// RecordID maps a document _id to its lock record's _id in
	// lockCollection: a template with one "{_id}" (default "{_id}"; with
	// text around it, such as "lock_{_id}", string _ids only). With
	// ExpiresField, a lockCollection record carries an absolute expiry
	// date (a TTL index with expireAfterSeconds 0) instead of TsField.
	RecordID string `yaml:"recordId"`
}

// WithDefaults returns s with the default field names of its type.
func (s Scheme) WithDefaults(defaultLeaseMS int64) Scheme {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	switch s.Type {
	case SchemeHolderFields:
		def(&s.Field, "LockId")
		def(&s.TimeField, "LockTime")
	case SchemeLockDocument:
		def(&s.Field, "Lock")
		def(&s.ActorField, "actor")
		def(&s.ExpiresField, "expiresAt")
		def(&s.HolderField, s.ActorField)
	case SchemeFlag:
		def(&s.Field, "locked")
		if s.Holder == "" {
			s.Holder = SchemeHolderClient
		}
		if s.LeaseMS == 0 {
			s.LeaseMS = defaultLeaseMS
		}
	case SchemeLockCollection:
		if s.ExpiresField == "" {
			def(&s.TsField, "ts")
		}
		def(&s.AidField, "aid")
		def(&s.RecordID, "{_id}")
		if s.Holder == "" {
			s.Holder = SchemeHolderClient
		}
		if s.LeaseMS == 0 {
			s.LeaseMS = defaultLeaseMS
		}
	}
	return s
}

// validateScheme checks one rule's scheme under key ("...scheme").
func (c *Config) validateScheme(v *validator, key string, s *Scheme) {
	if s == nil {
		return
	}
	if !s.Type.Valid() {
		v.add(key+".type", "must be one of %s, got %q", list(SchemeTypes()), s.Type)
		return
	}
	field := func(k, name string, allowDots bool) {
		switch {
		case name == "":
			return
		case name == "_id" || strings.HasPrefix(name, "_id."):
			v.add(key+"."+k, "must not be _id, got %q", name)
		case strings.HasPrefix(name, "$") || strings.Contains(name, ".$") || strings.ContainsRune(name, 0):
			v.add(key+"."+k, "must be a plain field name, got %q", name)
		case !allowDots && strings.Contains(name, "."):
			v.add(key+"."+k, "must be a field name without dots, got %q", name)
		case strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".") || strings.Contains(name, ".."):
			v.add(key+"."+k, "must be a field path, got %q", name)
		}
	}
	unused := func(k string, set bool) {
		if set {
			v.add(key+"."+k, "is not used by scheme type %q; remove it", s.Type)
		}
	}
	field("field", s.Field, true)
	if s.Type != SchemeLockCollection {
		unused("collection", s.Collection != "")
		unused("tsField", s.TsField != "")
		unused("aidField", s.AidField != "")
		unused("recordId", s.RecordID != "")
	}
	switch s.Type {
	case SchemeLockCollection:
		unused("field", s.Field != "")
		unused("timeField", s.TimeField != "")
		unused("actorField", s.ActorField != "")
		unused("holderField", s.HolderField != "")
		field("tsField", s.TsField, false)
		field("aidField", s.AidField, false)
		field("expiresField", s.ExpiresField, false)
		c.validateLockCollection(v, key, s)
		if s.Holder != "" && !s.Holder.Valid() {
			v.add(key+".holder", "must be one of %s, got %q", list(SchemeHolders()), s.Holder)
		}
		if s.LeaseMS < 0 {
			v.add(key+".leaseMS", "must be positive (0: lockstore.defaultLeaseMS), got %d", s.LeaseMS)
		}
		if s.Collection != "" {
			if e := checkCollName(s.Collection); e != "" {
				v.add(key+".collection", "%s, got %q", e, s.Collection)
			}
		}
	case SchemeLockgate:
		unused("field", s.Field != "")
		unused("timeField", s.TimeField != "")
		unused("actorField", s.ActorField != "")
		unused("expiresField", s.ExpiresField != "")
		unused("holderField", s.HolderField != "")
		unused("leaseMS", s.LeaseMS != 0)
		unused("holder", s.Holder != "")
	case SchemeHolderFields:
		field("timeField", s.TimeField, true)
		unused("actorField", s.ActorField != "")
		unused("expiresField", s.ExpiresField != "")
		unused("holderField", s.HolderField != "")
		unused("holder", s.Holder != "")
		if s.LeaseMS <= 0 {
			v.add(key+".leaseMS", "is required for holderFields: the application's lock timeout in milliseconds, got %d", s.LeaseMS)
		}
	case SchemeLockDocument:
		field("actorField", s.ActorField, false)
		field("expiresField", s.ExpiresField, false)
		field("holderField", s.HolderField, false)
		unused("timeField", s.TimeField != "")
		unused("leaseMS", s.LeaseMS != 0)
		unused("holder", s.Holder != "")
	case SchemeFlag:
		unused("timeField", s.TimeField != "")
		unused("actorField", s.ActorField != "")
		unused("expiresField", s.ExpiresField != "")
		unused("holderField", s.HolderField != "")
		if s.Holder != "" && !s.Holder.Valid() {
			v.add(key+".holder", "must be one of %s, got %q", list(SchemeHolders()), s.Holder)
		}
		if s.LeaseMS < 0 {
			v.add(key+".leaseMS", "must be positive (0: lockstore.defaultLeaseMS), got %d", s.LeaseMS)
		}
	}
	if s.LeaseMS > 0 && c.Lockstore.MaxLeaseMS > 0 && s.LeaseMS > c.Lockstore.MaxLeaseMS {
		v.add(key+".leaseMS", "must not exceed lockstore.maxLeaseMS (%d), got %d", c.Lockstore.MaxLeaseMS, s.LeaseMS)
	}
	d := s.WithDefaults(1)
	if d.Field != "" && (d.TimeField == d.Field) {
		v.add(key+".timeField", "must differ from field %q", d.Field)
	}
	if d.Type == SchemeLockCollection && d.TsField != "" && d.TsField == d.AidField {
		v.add(key+".aidField", "must differ from tsField %q", d.TsField)
	}
	if d.Type == SchemeLockCollection && d.ExpiresField != "" && d.ExpiresField == d.AidField {
		v.add(key+".aidField", "must differ from expiresField %q", d.ExpiresField)
	}
	if d.Type == SchemeLockDocument && d.ActorField == d.ExpiresField {
		v.add(key+".expiresField", "must differ from actorField %q", d.ActorField)
	}
	if d.Type == SchemeLockDocument && d.HolderField == d.ExpiresField {
		v.add(key+".holderField", "must differ from expiresField %q", d.ExpiresField)
	}
}

// Clients narrows a namespace rule to some clients: the rule's mode
// applies to a client that matches every list given (any entry of a
// list), OtherClients' mode to everyone else. Client-chosen values
// (application names) are not authentication: see docs/SCHEMES.md.
type Clients struct {
	AppNames []string `yaml:"appNames"`
	// Users are "user@db" as the upstream authenticated them.
	Users []string `yaml:"users"`
	// Networks are CIDR blocks of client addresses ("10.1.0.0/16").
	Networks []string `yaml:"networks"`
}

// validateSchemeRule checks what a rule's scheme rules out, and its
// clients and otherClients, under key.
func (c *Config) validateSchemeRule(v *validator, key string, r NamespaceRule) {
	if r.Scheme != nil && r.Scheme.Type != "" && r.Scheme.Type != SchemeLockgate && r.Fence == FenceDocument {
		v.add(key+".fence", "is not supported with scheme %q: the fence stamps lockgate's own lock tokens, which a scheme's writes do not carry", r.Scheme.Type)
	}
	if r.Clients == nil {
		if r.OtherClients != "" {
			v.add(key+".otherClients", "is only used with clients; remove it or name the clients")
		}
		return
	}
	cl := r.Clients
	if len(cl.AppNames)+len(cl.Users)+len(cl.Networks) == 0 {
		v.add(key+".clients", "names no appNames, users or networks; remove it to apply the rule to every client")
	}
	for i, n := range cl.Networks {
		if _, _, err := net.ParseCIDR(n); err != nil {
			v.add(fmt.Sprintf("%s.clients.networks[%d]", key, i), "must be a CIDR block such as \"10.1.0.0/16\", got %q", n)
		}
	}
	if r.OtherClients != "" && !r.OtherClients.Valid() {
		v.add(key+".otherClients", "must be one of %s, got %q", list(Modes()), r.OtherClients)
	}
}
