package policy

import (
	"strings"
	"time"

	"github.com/lockgate/lockgate/config"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Scheme is a rule's advisory locking convention, compiled. The zero
// value is lockgate's own lock commands. It is comparable and prints its
// content, so that the policy fingerprint covers it.
type Scheme struct {
	Type config.SchemeType // "" for lockgate's own commands
	// HolderPath is where the holder value is: holderFields' field,
	// lockDocument's field.holderField (default field.actorField); flag's
	// flag.
	HolderPath string
	// LockPath is the lock's root field (holderFields' field,
	// lockDocument's sub-document, the flag).
	LockPath string
	// TimePath refreshes a holderFields lease; ExpiresPath carries a
	// lockDocument's absolute expiry.
	TimePath    string
	ExpiresPath string
	// ActorPath is lockDocument's field.actorField: HolderPath unless
	// holderField names another field.
	ActorPath string
	// Lease is how long a lock lives without a renewing write
	// (holderFields, flag); lockDocument's comes from ExpiresPath.
	Lease  time.Duration
	Holder config.SchemeHolder
	// LockColl is lockCollection's lock collection ("" : "<coll>.lock");
	// TsPath and AidPath a record's fields. LockSide marks the rule as
	// Lookup returns it for the lock collection itself.
	LockColl string
	TsPath   string
	AidPath  string
	LockSide bool
	// RecordID is lockCollection's record _id template (recordId);
	// ExpiresPath then names a record's absolute expiry, if it has one
	// instead of TsPath.
	RecordID string
}

// MirrorNS is the namespace of the mirror lock of a write on ns: the lock
// collection's for lockCollection (a record covers the document of the
// same _id in every collection it serves), ns itself otherwise.
func (s Scheme) MirrorNS(ns string) string {
	if s.Type == config.SchemeLockCollection && !s.LockSide {
		return s.LockNS(ns)
	}
	return ns
}

// IdentityHolder reports whether the holder is a client identity (the
// writes carry no holder value): flag and lockCollection.
func (s Scheme) IdentityHolder() bool {
	return s.Type == config.SchemeFlag || s.Type == config.SchemeLockCollection
}

// Active reports whether the rule uses a document scheme instead of
// lockgate's own commands.
func (s Scheme) Active() bool { return s.Type != "" && s.Type != config.SchemeLockgate }

// compileScheme turns a configured scheme into a Scheme.
func compileScheme(c *config.Scheme, defaultLeaseMS int64) Scheme {
	if c == nil || c.Type == "" || c.Type == config.SchemeLockgate {
		return Scheme{}
	}
	d := c.WithDefaults(defaultLeaseMS)
	s := Scheme{Type: d.Type, LockPath: d.Field, HolderPath: d.Field, Holder: d.Holder,
		Lease: time.Duration(d.LeaseMS) * time.Millisecond}
	switch d.Type {
	case config.SchemeHolderFields:
		s.TimePath = d.TimeField
	case config.SchemeLockDocument:
		s.HolderPath = d.Field + "." + d.HolderField
		s.ActorPath = d.Field + "." + d.ActorField
		s.ExpiresPath = d.Field + "." + d.ExpiresField
	case config.SchemeLockCollection:
		s.LockColl, s.TsPath, s.AidPath = d.Collection, d.TsField, d.AidField
		s.RecordID, s.ExpiresPath = d.RecordID, d.ExpiresField
	}
	return s
}

// StepKind is what a write is under a scheme.
type StepKind int

const (
	// StepOther does not follow the scheme (Step.Why says how).
	StepOther StepKind = iota
	// StepAcquire takes the lock the scheme's way.
	StepAcquire
	// StepHolder is a write by the holder (Step.Ends: it releases the
	// lock or deletes the document).
	StepHolder
	// StepInsert creates an unlocked document.
	StepInsert
)

// Step is a write read under a scheme.
type Step struct {
	Kind StepKind
	// ID is the one _id the write pins (not for StepInsert).
	ID bsoncore.Value
	// Holder is the holder value: the one an acquire sets, the one a
	// holder write names in its filter (holderFields, lockDocument).
	Holder bsoncore.Value
	// Ends: after the write the lock is free (release, delete).
	Ends bool
	// Delete: the write removes the document.
	Delete bool
	// Renew: the write refreshes the lease (holderFields' time field,
	// lockDocument's expiry).
	Renew bool
	// Expires is the absolute expiry an acquire or renew of a
	// lockDocument sets, zero when not a date.
	Expires time.Time
	// Why says, for StepOther, what the write does wrong.
	Why string
	// ReleaseAll: a delete of every lock record whose holder id (Aid) is
	// Holder (lockCollection).
	ReleaseAll bool
}

// fieldState is what an update does to one field path.
type fieldState int

const (
	untouched fieldState = iota
	setTo                // set to a value (held, unless null)
	removed              // unset, or set to null
	unknown              // changed in a way that cannot be read as set or unset
)

// SchemeStep reads write w under scheme s. It never guesses: whatever is
// not plainly one of the scheme's steps is StepOther.
func SchemeStep(s Scheme, w Write) Step {
	if s.Type == config.SchemeLockCollection {
		return lockCollectionStep(s, w)
	}
	switch w.Kind {
	case KindInsert:
		v, st := docPath(w.Doc, s.HolderPath)
		if st == setTo && held(s, v) {
			return Step{Why: "it inserts a document that is already locked (" + s.HolderPath + " set); insert it unlocked, then take the lock the scheme's way"}
		}
		return Step{Kind: StepInsert}
	case KindUpdate, KindDelete, KindFindAndModify:
	default:
		return Step{Why: "it is not a single-document write"}
	}
	ids, _, ok := PinnedIDs(w.Filter)
	if !ok || len(ids) != 1 {
		return Step{Why: "under a locking scheme every write must name exactly one _id in its filter"}
	}
	step := Step{ID: ids[0]}
	fv, inFilter := filterEq(w.Filter, s.HolderPath)
	holderInFilter := inFilter && held(s, fv)
	if w.Kind == KindDelete || w.Remove {
		step.Ends, step.Delete = true, true
		if s.Type != config.SchemeFlag && !holderInFilter {
			return Step{Why: "a delete must name the holder: " + s.HolderPath + " in its filter"}
		}
		step.Kind, step.Holder = StepHolder, fv
		return step
	}
	if w.Update.Type != bson.TypeEmbeddedDocument {
		return Step{Why: "a pipeline update cannot be read as a step of the scheme; use update operators"}
	}
	u := w.Update.Document()
	nv, st := updatePath(u, s.HolderPath)
	if st == untouched && s.Type == config.SchemeLockDocument {
		// The sub-document as a whole: {$set: {Lock: null}} or $unset.
		if _, rs := updatePath(u, s.LockPath); rs == removed {
			st = removed
		}
	}
	if st == unknown {
		return Step{Why: "it changes " + s.HolderPath + " other than by $set or $unset"}
	}
	if s.Type == config.SchemeFlag {
		switch {
		case st == setTo && held(s, nv):
			step.Kind = StepAcquire
		case st == setTo || st == removed:
			step.Kind, step.Ends = StepHolder, true
		default:
			step.Kind = StepHolder
		}
		return step
	}
	newHolder := st == setTo && held(s, nv)
	switch {
	case newHolder && !(holderInFilter && sameValue(fv, nv)):
		step.Kind, step.Holder = StepAcquire, nv
		step.Expires = expiry(s, u)
		return step
	case !holderInFilter:
		return Step{Why: "it names no holder: a write must carry " + s.HolderPath + ": <holder> in its filter, or take the lock the scheme's way"}
	}
	step.Kind, step.Holder = StepHolder, fv
	step.Ends = st == removed || (st == setTo && !held(s, nv))
	switch {
	case s.TimePath != "":
		_, ts := updatePath(u, s.TimePath)
		step.Renew = ts == setTo
	case s.ExpiresPath != "":
		step.Expires = expiry(s, u)
		step.Renew = !step.Expires.IsZero()
	}
	return step
}

// expiry is the lockDocument expiry an update sets, zero if none.
func expiry(s Scheme, u bsoncore.Document) time.Time {
	if s.ExpiresPath == "" {
		return time.Time{}
	}
	v, st := updatePath(u, s.ExpiresPath)
	if st != setTo || v.Type != bson.TypeDateTime {
		return time.Time{}
	}
	return time.UnixMilli(v.DateTime()).UTC()
}

// held reports whether v is a holding value of the scheme's holder field.
func held(s Scheme, v bsoncore.Value) bool {
	switch v.Type {
	case 0, bson.TypeNull, bson.TypeUndefined:
		return false
	}
	if s.Type == config.SchemeFlag {
		b, ok := v.BooleanOK()
		return ok && b
	}
	return true
}

// filterEq finds an equality on path in a filter: {path: v},
// {path: {$eq: v}}, at the top level or in a top-level $and.
func filterEq(f bsoncore.Document, path string) (bsoncore.Value, bool) {
	elems, err := f.Elements()
	if err != nil {
		return bsoncore.Value{}, false
	}
	for _, e := range elems {
		k := e.Key()
		switch {
		case k == path:
			v := e.Value()
			if d, ok := v.DocumentOK(); ok {
				if first, err := d.IndexErr(0); err == nil && strings.HasPrefix(first.Key(), "$") {
					if first.Key() == "$eq" {
						if n, _ := d.Elements(); len(n) == 1 {
							return first.Value(), true
						}
					}
					return bsoncore.Value{}, false
				}
			}
			return v, true
		case k == "$and":
			arr, ok := e.Value().ArrayOK()
			if !ok {
				continue
			}
			vals, _ := arr.Values()
			for _, av := range vals {
				if d, ok := av.DocumentOK(); ok {
					if v, ok := filterEq(d, path); ok {
						return v, true
					}
				}
			}
		}
	}
	return bsoncore.Value{}, false
}

// updatePath says what update u (operators or a replacement) does to path.
func updatePath(u bsoncore.Document, path string) (bsoncore.Value, fieldState) {
	first, err := u.IndexErr(0)
	if err != nil {
		return bsoncore.Value{}, untouched
	}
	if !strings.HasPrefix(first.Key(), "$") {
		return docPath(u, path)
	}
	elems, _ := u.Elements()
	var val bsoncore.Value
	state := untouched
	for _, op := range elems {
		fields, ok := op.Value().DocumentOK()
		if !ok {
			continue
		}
		fs, _ := fields.Elements()
		for _, f := range fs {
			k := f.Key()
			var s fieldState
			var v bsoncore.Value
			switch {
			case k == path:
				switch op.Key() {
				case "$set", "$setOnInsert":
					v, s = f.Value(), setTo
					if !held(Scheme{}, v) {
						s = removed
					}
				case "$unset":
					s = removed
				default:
					s = unknown
				}
			case strings.HasPrefix(path, k+"."):
				// A parent of path: its new value decides.
				switch op.Key() {
				case "$set", "$setOnInsert":
					if d, ok := f.Value().DocumentOK(); ok {
						v, s = docPath(d, strings.TrimPrefix(path, k+"."))
					} else {
						s = removed
					}
				case "$unset":
					s = removed
				default:
					s = unknown
				}
			case strings.HasPrefix(k, path+"."):
				s = unknown // a part of the holder value
			case op.Key() == "$rename" && renamesOnto(f.Value(), path):
				s = unknown
			default:
				continue
			}
			if state != untouched && (state != s || !sameValue(val, v)) {
				return bsoncore.Value{}, unknown
			}
			state, val = s, v
		}
	}
	return val, state
}

// docPath looks path up in a whole document (a replacement or an insert):
// absent or null is removed.
func docPath(d bsoncore.Document, path string) (bsoncore.Value, fieldState) {
	v, err := d.LookupErr(strings.Split(path, ".")...)
	if err != nil || !held(Scheme{}, v) {
		return bsoncore.Value{}, removed
	}
	return v, setTo
}

// renamesOnto reports whether a $rename target overwrites path or a parent
// or part of it.
func renamesOnto(to bsoncore.Value, path string) bool {
	t, ok := to.StringValueOK()
	return ok && (t == path || strings.HasPrefix(path, t+".") || strings.HasPrefix(t, path+"."))
}
