package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/namespace"
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
func (s Scheme) MirrorNS(ns namespace.Namespace) namespace.Namespace {
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
func (s *Scheme) Active() bool { return s.Type != "" && s.Type != config.SchemeLockgate }

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
	// Touches: on a document that exists, the write changes something
	// besides the lock's own fields (a replacement or a delete always
	// does).
	Touches bool
	// Replace: the update is a whole-document replacement.
	Replace bool
	// ByIdentity: a lockDocument write that names no holder value; it is
	// the holder's only from the client identity that took the lock.
	ByIdentity bool
	// LockTime is the date a holderFields write sets its time field to;
	// TimeNow that it stamps it with the server's date ($currentDate).
	LockTime time.Time
	TimeNow  bool
	// FlagFalse: a flag write that leaves the flag false (not null, not
	// missing: the scheme's acquire matches false only).
	FlagFalse bool
	// Pick: an acquire by findOneAndUpdate whose filter names no one _id;
	// it locks the first free document the filter finds (ID is zero).
	Pick bool
}

// fieldState is what an update does to one field path.
type fieldState int

const (
	untouched fieldState = iota
	setTo                // set to a value (held, unless null)
	removed              // unset, or set to null
	unknown              // changed in a way that cannot be read as set or unset
	stamped              // set to the server's current date ($currentDate)
)

// SchemeStep reads write w under scheme s. It never guesses: whatever is
// not plainly one of the scheme's steps is StepOther. It reads what the
// write does to a document that exists (where $setOnInsert sets nothing)
// and, for an upsert, to the document it would insert; the lock's state
// (who holds it, whether the document shows it live) is the guard's.
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
		if lv, ls := docPath(w.Doc, s.LockPath); ls == setTo && !lockShape(s, lv) {
			return Step{Why: s.LockPath + " must be a document (or null) under the lockDocument scheme"}
		}
		return Step{Kind: StepInsert}
	case KindUpdate, KindDelete, KindFindAndModify:
	default:
		return Step{Why: "it is not a single-document write"}
	}
	ids, _, ok := PinnedIDs(w.Filter)
	if !ok || len(ids) != 1 {
		// Tharga.MongoDB's PickForUpdateAsync(filter): a findOneAndUpdate
		// that locks whichever free document its filter finds first.
		if st := schemeStepOn(s, w, bsoncore.Value{}); st.Kind == StepAcquire && s.Type != config.SchemeFlag &&
			w.Kind == KindFindAndModify && !w.Upsert && !w.Remove && w.Sort == nil {
			st.Pick = true
			return st
		}
		return Step{Why: "under a locking scheme every write must name exactly one _id in its filter (an acquire by findOneAndUpdate without sort or upsert may name several)"}
	}
	return schemeStepOn(s, w, ids[0])
}

// schemeStepOn is SchemeStep for an update, delete or findAndModify of the
// document id (zero: of one of several, for a pick).
func schemeStepOn(s Scheme, w Write, id bsoncore.Value) Step {
	step := Step{ID: id}
	var fv bsoncore.Value
	holderInFilter := false
	if s.Type != config.SchemeFlag {
		v, inFilter := filterEq(w.Filter, s.HolderPath)
		if inFilter && held(s, v) {
			if !exactValue(v) {
				return Step{Why: "the holder value in its filter (" + s.HolderPath + ") must be one exact value, not a regular expression or an array"}
			}
			fv, holderInFilter = v, true
		}
	}
	if w.Kind == KindDelete || w.Remove {
		step.Ends, step.Delete, step.Touches = true, true, true
		step.Kind, step.Holder = StepHolder, fv
		if s.Type != config.SchemeFlag && !holderInFilter {
			if s.Type != config.SchemeLockDocument {
				return Step{Why: "a delete must name the holder: " + s.HolderPath + " in its filter"}
			}
			step.ByIdentity = true
		}
		return step
	}
	if w.Update.Type != bson.TypeEmbeddedDocument {
		return Step{Why: "a pipeline update cannot be read as a step of the scheme; use update operators"}
	}
	u := w.Update.Document()
	step.Replace = isReplacement(u)
	step.Touches = step.Replace || touchesOther(s, u)
	if lv, ls := updatePath(u, s.LockPath, false); ls == setTo && !lockShape(s, lv) {
		return Step{Why: s.LockPath + " must be a document (or null) under the lockDocument scheme"}
	}
	nv, st := updatePath(u, s.HolderPath, false)
	if st == untouched && s.Type == config.SchemeLockDocument {
		// The sub-document as a whole: {$set: {Lock: null}} or $unset.
		if _, rs := updatePath(u, s.LockPath, false); rs == removed {
			st = removed
		}
	}
	switch {
	case st == unknown || st == stamped:
		return Step{Why: "it changes " + s.HolderPath + " other than by $set or $unset"}
	case st == setTo && !exactValue(nv):
		return Step{Why: "it sets " + s.HolderPath + " to a regular expression or an array, which no filter names exactly"}
	}
	if s.Type == config.SchemeFlag {
		return flagStep(s, w, step, nv, st)
	}
	if st == setTo && !(holderInFilter && sameValue(fv, nv)) {
		// A new holder: an acquire, if that is all the write does.
		if step.Touches {
			return Step{Why: "an acquire sets the lock's fields and nothing else (take the lock, then write as its holder)"}
		}
		if w.Upsert {
			if iv, ist := insertedPath(s, w, s.HolderPath); ist != setTo || !sameValue(iv, nv) {
				return Step{Why: "an upsert that takes the lock must create the document locked by the holder it sets"}
			}
		}
		step.Kind, step.Holder = StepAcquire, nv
		if why := leaseOf(s, u, &step); why != "" {
			return Step{Why: why}
		}
		if !step.Renew {
			return Step{Why: "an acquire must set " + s.leasePath() + " to a date, or the lock would never expire"}
		}
		step.Renew = false
		return step
	}
	if !holderInFilter {
		if s.Type != config.SchemeLockDocument {
			return Step{Why: "it names no holder: a write must carry " + s.HolderPath + ": <holder> in its filter, or take the lock the scheme's way"}
		}
		// Tharga.MongoDB abandons its lock by _id alone: the holder's
		// write only from the client that took the lock.
		step.ByIdentity = true
	}
	if w.Upsert {
		return Step{Why: "an upsert of a holder's write could create a locked document that no lock covers; write without upsert"}
	}
	step.Kind, step.Holder = StepHolder, fv
	step.Ends = st == removed
	if !step.Ends {
		if why := leaseOf(s, u, &step); why != "" {
			return Step{Why: why}
		}
	}
	return step
}

// flagStep reads an update under flag: setting the flag and nothing else
// is an acquire; anything else is the holder's, and clears the flag if it
// ends up other than true.
func flagStep(s Scheme, w Write, step Step, nv bsoncore.Value, st fieldState) Step {
	switch {
	case st == setTo && nv.Type != bson.TypeBoolean:
		return Step{Why: "it sets the flag " + s.LockPath + " to a value that is not a boolean"}
	case st == removed:
		// Unset or null, the flag matches the scheme's acquire
		// ({flag: false}) never again.
		return Step{Why: "it leaves the flag " + s.LockPath + " unset or null, which the scheme's acquire never matches; release by setting it to false"}
	}
	step.Kind = StepHolder
	switch {
	case st == setTo && nv.Boolean() && !step.Touches:
		step.Kind = StepAcquire
	case st == removed || st == setTo && !nv.Boolean():
		step.Ends, step.FlagFalse = true, st == setTo
	}
	if w.Upsert && step.Kind != StepAcquire {
		if iv, ist := insertedPath(s, w, s.LockPath); ist == unknown || ist == stamped || ist == setTo && held(s, iv) {
			return Step{Why: "an upsert that is not the acquire could create a document with the flag set that no lock covers"}
		}
	}
	return step
}

// leaseOf reads what update u does to the lock's time (holderFields'
// time field, lockDocument's expiry) into step: Renew with LockTime,
// TimeNow or Expires when it sets one; why when it does so in a way the
// mirror cannot follow.
func leaseOf(s Scheme, u bsoncore.Document, step *Step) (why string) {
	p := s.leasePath()
	v, st := updatePath(u, p, false)
	switch {
	case st == untouched:
	case st == stamped && s.TimePath != "":
		step.Renew, step.TimeNow = true, true
	case st == setTo && v.Type == bson.TypeDateTime:
		step.Renew = true
		at := time.UnixMilli(v.DateTime()).UTC()
		if s.TimePath != "" {
			step.LockTime = at
		} else {
			step.Expires = at
		}
	case st == removed:
		return "it removes " + p + " while the lock stays, so the lock would never expire"
	default:
		return p + " must be a date (a BSON date" + map[bool]string{true: ", or $currentDate", false: ""}[s.TimePath != ""] + ")"
	}
	return ""
}

// leasePath is the field that times the lock: holderFields' time field,
// lockDocument's expiry.
func (s Scheme) leasePath() string {
	if s.TimePath != "" {
		return s.TimePath
	}
	return s.ExpiresPath
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

// isReplacement reports whether update document u replaces the whole
// document: its first key is no operator, or it is empty (which the
// server reads as a replacement by nothing).
func isReplacement(u bsoncore.Document) bool {
	first, err := u.IndexErr(0)
	return err != nil || !strings.HasPrefix(first.Key(), "$")
}

// updatePath says what update u (operators or a replacement) does to path
// on a document that exists, or, inserting, on the document an upsert
// creates: $setOnInsert applies only then.
func updatePath(u bsoncore.Document, path string, inserting bool) (bsoncore.Value, fieldState) {
	if isReplacement(u) {
		return docPath(u, path)
	}
	elems, _ := u.Elements()
	var val bsoncore.Value
	state := untouched
	for _, op := range elems {
		if op.Key() == "$setOnInsert" && !inserting {
			continue
		}
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
				case "$currentDate":
					s = unknown
					if b, ok := f.Value().BooleanOK(); ok && b {
						s = stamped
					} else if d, ok := f.Value().DocumentOK(); ok {
						if t, ok := d.Lookup("$type").StringValueOK(); ok && t == "date" {
							s = stamped
						}
					}
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

// exactValue reports whether v, as a filter's value, matches one value
// only: a regular expression matches many strings, and an array also
// matches the arrays that contain it.
func exactValue(v bsoncore.Value) bool {
	switch v.Type {
	case bson.TypeRegex, bson.TypeArray:
		return false
	}
	return true
}

// mentions reports whether filter has a top-level condition (or one in a
// top-level $and) on path, a parent of it or a part of it.
func mentions(filter bsoncore.Document, path string) bool {
	elems, err := filter.Elements()
	if err != nil {
		return true
	}
	for _, e := range elems {
		k := e.Key()
		if k == "$and" {
			arr, ok := e.Value().ArrayOK()
			if !ok {
				return true
			}
			vals, _ := arr.Values()
			for _, av := range vals {
				if d, ok := av.DocumentOK(); !ok || mentions(d, path) {
					return true
				}
			}
			continue
		}
		if overlaps(k, path) {
			return true
		}
	}
	return false
}

// overlaps reports whether field paths a and b are the same field or one
// holds the other.
func overlaps(a, b string) bool {
	return a == b || strings.HasPrefix(a, b+".") || strings.HasPrefix(b, a+".")
}

// lockPaths are the fields a scheme's lock is made of: what an acquire
// may set, and nothing else.
func (s Scheme) lockPaths() []string {
	if s.Type == config.SchemeHolderFields {
		return []string{s.HolderPath, s.TimePath}
	}
	return []string{s.LockPath}
}

// inLock reports whether field path k lies within the lock's fields (a
// parent of one does not: setting it replaces its other fields too).
func (s Scheme) inLock(k string) bool {
	for _, p := range s.lockPaths() {
		if k == p || strings.HasPrefix(k, p+".") {
			return true
		}
	}
	return false
}

// touchesOther reports whether operator update u, on a document that
// exists, may change a field outside the lock.
func touchesOther(s Scheme, u bsoncore.Document) bool {
	elems, err := u.Elements()
	if err != nil {
		return true
	}
	for _, op := range elems {
		if op.Key() == "$setOnInsert" {
			continue
		}
		fields, ok := op.Value().DocumentOK()
		if !ok {
			return true
		}
		fs, err := fields.Elements()
		if err != nil {
			return true
		}
		for _, f := range fs {
			if !s.inLock(f.Key()) {
				return true
			}
			if op.Key() == "$rename" {
				if to, ok := f.Value().StringValueOK(); !ok || !s.inLock(to) {
					return true
				}
			}
		}
	}
	return false
}

// insertedPath says what path holds in the document upsert w would
// insert: a replacement is that document; otherwise the filter's
// equalities, then $set and $setOnInsert. A filter condition on path
// that is no plain equality makes it unknown.
func insertedPath(s Scheme, w Write, path string) (bsoncore.Value, fieldState) {
	u := w.Update.Document()
	if isReplacement(u) {
		return docPath(u, path)
	}
	if v, st := updatePath(u, path, true); st != untouched {
		return v, st
	}
	parts := strings.Split(path, ".")
	for i := len(parts); i > 0; i-- {
		p := strings.Join(parts[:i], ".")
		v, ok := filterEq(w.Filter, p)
		if !ok {
			continue
		}
		if i == len(parts) {
			if !held(Scheme{}, v) {
				return bsoncore.Value{}, removed
			}
			return v, setTo
		}
		if d, ok := v.DocumentOK(); ok {
			return docPath(d, strings.Join(parts[i:], "."))
		}
		return bsoncore.Value{}, removed
	}
	if mentions(w.Filter, path) {
		return bsoncore.Value{}, unknown
	}
	return bsoncore.Value{}, removed
}

// FreeCondition is the filter clause under which the database itself
// finds the lock free or expired at now: an acquire forwarded with it
// cannot take a lock the document shows live, whatever the mirror says.
func (s Scheme) FreeCondition(now time.Time) bsoncore.Document {
	b := bsoncore.NewDocumentBuilder()
	switch s.Type {
	case config.SchemeFlag:
		return b.AppendDocument(s.LockPath, bsoncore.NewDocumentBuilder().AppendBoolean("$ne", true).Build()).Build()
	case config.SchemeHolderFields:
		now = now.Add(-s.Lease)
	}
	expired := bsoncore.NewDocumentBuilder().AppendDocument(s.leasePath(),
		bsoncore.NewDocumentBuilder().AppendDateTime("$lt", now.UnixMilli()).Build()).Build()
	free := bsoncore.NewDocumentBuilder().AppendNull(s.HolderPath).Build()
	return b.AppendArray("$or", bsoncore.NewArrayBuilder().AppendDocument(free).AppendDocument(expired).Build()).Build()
}

// HolderCondition is the filter clause naming holder v exactly.
func (s Scheme) HolderCondition(v bsoncore.Value) bsoncore.Document {
	return bsoncore.NewDocumentBuilder().AppendDocument(s.HolderPath, bsoncore.NewDocumentBuilder().AppendValue("$eq", v).Build()).Build()
}

// ReadPaths are the top-level fields that hold a scheme's lock, to read
// it from a document.
func (s Scheme) ReadPaths() []string {
	var out []string
	for _, p := range s.lockPaths() {
		root, _, _ := strings.Cut(p, ".")
		if !slices.Contains(out, root) {
			out = append(out, root)
		}
	}
	return out
}

// JoinFilter returns body, one statement's command as the guard sends it
// (findAndModify, or a one-element statement list), with clause ANDed
// into the filter of statement w, the filter's own fields left in place
// (see joinClause).
func JoinFilter(body bsoncore.Document, w Write, clause bsoncore.Document) (bsoncore.Document, error) {
	join := func(stmt bsoncore.Document, key string, add bool) (bsoncore.Document, error) {
		orig := emptyDoc
		if v, err := stmt.LookupErr(key); err == nil {
			d, ok := v.DocumentOK()
			if !ok {
				return nil, fmt.Errorf("%s is not a document", key)
			}
			orig = d
		} else if !add {
			return nil, fmt.Errorf("the statement has no %s", key)
		}
		return replaceField(stmt, key, bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: joinClause(orig, clause)}, add)
	}
	if w.FilterKey == "" {
		// A legacy opcode's selector: the guard sends no such statement.
		return nil, fmt.Errorf("a %s statement has no filter field", w.List)
	}
	if w.List == "" {
		return join(body, w.FilterKey, true) // findAndModify: the body is the statement
	}
	arr, ok := body.Lookup(w.List).ArrayOK()
	if !ok {
		return nil, fmt.Errorf("no statement list %q", w.List)
	}
	vals, err := arr.Values()
	if err != nil || len(vals) != 1 {
		return nil, fmt.Errorf("statement list %q holds %d statements, not one", w.List, len(vals))
	}
	stmt, ok := vals[0].DocumentOK()
	if !ok {
		return nil, fmt.Errorf("statement %q[0] is not a document", w.List)
	}
	stmt, err = join(stmt, w.FilterKey, false)
	if err != nil {
		return nil, err
	}
	return replaceField(body, w.List, bsoncore.Value{Type: bson.TypeArray, Data: buildArray([]bsoncore.Document{stmt})}, false)
}

// lockShape reports whether v may be a lockDocument's lock: a document
// (a lock lockgate can read), or anything for the other schemes.
func lockShape(s Scheme, v bsoncore.Value) bool {
	return s.Type != config.SchemeLockDocument || v.Type == bson.TypeEmbeddedDocument
}
