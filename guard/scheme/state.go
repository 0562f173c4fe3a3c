package scheme

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// Reader reads the lock fields of one document with the proxy's own
// authority (guard.MongoResolver implements it): the state a scheme decision
// starts from when the mirror holds nothing, and what the database shows
// after an acquire or release.
type Reader interface {
	// LockFields returns the fields top of document id in ns (only them),
	// and whether the document exists.
	LockFields(ctx context.Context, ns namespace.Namespace, id docid.ID, top []string) (bsoncore.Document, bool, error)
}

// docLock is the lock a document shows.
type docLock struct {
	exists bool
	// holder is the holder value the document shows (flag: true), zero
	// when it shows none.
	holder bsoncore.Value
	// ends is when the document's lock expires (holderFields: its time
	// plus the lease; lockDocument: its expiry); zero for a flag.
	ends time.Time
	// bad says why the lock cannot be mirrored ("" when it can).
	bad string
}

// live reports whether the document shows a lock that has not expired at
// now (a lock that cannot be mirrored counts as live: nobody may take it).
func (d docLock) live(now time.Time) bool {
	return d.holder.Type != 0 && (d.bad != "" || d.ends.IsZero() || d.ends.After(now))
}

// readDocLock reads the lock document id of ns shows under scheme s.
func (sc *Schemes) readDocLock(ctx context.Context, s policy.Scheme, ns namespace.Namespace, id docid.ID) (docLock, error) {
	rd := sc.cfg.Reader
	if rd == nil {
		return docLock{}, errors.New("the proxy has no client of its own to read the document's lock with")
	}
	doc, found, err := rd.LockFields(ctx, ns, id, s.ReadPaths())
	if err != nil || !found {
		return docLock{}, err
	}
	return lockOf(s, doc), nil
}

// lockOf reads the lock doc shows under scheme s.
func lockOf(s policy.Scheme, doc bsoncore.Document) docLock {
	d := docLock{exists: true}
	if s.Type == config.SchemeLockDocument {
		v, err := doc.LookupErr(s.LockPath)
		if err == nil && v.Type != bson.TypeNull && v.Type != bson.TypeEmbeddedDocument {
			d.holder = v
			d.bad = fmt.Sprintf("%s is of type %s, not a document", s.LockPath, v.Type)
			return d
		}
	}
	parts := pathOf(s.HolderPath)
	for i := 1; i < len(parts); i++ {
		if p, err := doc.LookupErr(parts[:i]...); err == nil && p.Type == bson.TypeArray {
			// A filter on the path matches any element: no one holder.
			d.holder = p
			d.bad = fmt.Sprintf("%s is an array", strings.Join(parts[:i], "."))
			return d
		}
	}
	v, err := doc.LookupErr(parts...)
	if err != nil || v.Type == bson.TypeNull || v.Type == bson.TypeUndefined {
		return d
	}
	if s.Type == config.SchemeFlag {
		if b, ok := v.BooleanOK(); ok && b {
			d.holder = v
		}
		return d
	}
	d.holder = bsoncore.Value{Type: v.Type, Data: append([]byte(nil), v.Data...)}
	if v.Type == bson.TypeArray || v.Type == bson.TypeRegex {
		d.bad = fmt.Sprintf("its holder %s is of type %s, which no filter names exactly", s.HolderPath, v.Type)
		return d
	}
	lp := s.TimePath
	if lp == "" {
		lp = s.ExpiresPath
	}
	t, err := doc.LookupErr(pathOf(lp)...)
	switch {
	case err != nil || t.Type == bson.TypeNull:
		d.bad = fmt.Sprintf("%s is missing, so the lock never expires", lp)
	case t.Type != bson.TypeDateTime:
		d.bad = fmt.Sprintf("%s is of type %s, not a date", lp, t.Type)
	default:
		d.ends = time.UnixMilli(t.DateTime())
		if s.TimePath != "" {
			d.ends = d.ends.Add(s.Lease)
		}
	}
	return d
}

func pathOf(p string) []string { return strings.Split(p, ".") }

// unmirrorableError: the document shows a lock lockgate cannot mirror.
type unmirrorableError struct{ why string }

func (e *unmirrorableError) Error() string { return e.why }

// adoptDocLock makes the mirror at least as strict as document lock d: a
// live lock the document shows is taken into the mirror for its holder
// until the document's own end. Someone else holding the mirror already is
// no error (the mirror is the stricter then). A lock that cannot be
// mirrored is an *unmirrorableError.
func (sc *Schemes) adoptDocLock(ctx context.Context, req *proxy.Request, r policy.Rule, ns namespace.Namespace, id docid.ID, d docLock) error {
	now := time.Now()
	if !d.live(now) || r.Scheme.Type == config.SchemeFlag {
		return nil
	}
	if d.bad != "" {
		return &unmirrorableError{why: "the document's lock cannot be mirrored: " + d.bad}
	}
	o, _ := sc.owner(req, ns, r.Scheme, d.holder)
	// Whoever took the lock, it was not this request's client.
	o.App, o.Client, o.User = "(lock adopted from the document)", "", ""
	mns, ids := r.Scheme.MirrorNS(ns), []docid.ID{id}
	// A mirror held already, by this holder or another, is at least as
	// strict: nothing to adopt. Taking the holder's own mirror again
	// through this proxy would succeed (re-entrant), make the hold one
	// that two lockgates changed, and so make its release wait for the
	// other's cache (lockstore quiesce, a second): every acquire that met
	// a held lock through the other proxy would slow the holder's release.
	sts, err := sc.cfg.Store.Status(ctx, o, mns, ids)
	if err != nil {
		return err
	}
	if len(sts) == 1 && sts[0].Held {
		return nil
	}
	_, err = sc.cfg.Store.Acquire(ctx, o, mns, ids, d.ends.Sub(now), 0)
	switch {
	case err == nil:
		// The holder may have released between the read and the
		// adoption (through another proxy, whose release found no
		// mirror of ours to drop): read again, and keep the mirror only
		// for a lock the document still shows. A failed read keeps it.
		again, err := sc.readDocLock(ctx, r.Scheme, ns, id)
		if err == nil && !(sameHolder(again.holder, d.holder) && again.live(time.Now())) {
			if _, err := sc.cfg.Store.Release(ctx, o, mns, ids, ""); err != nil {
				sc.cfg.Log.Warn("dropping a scheme lock adopted from a released document failed; it expires with its lease", zap.String("ns", ns.String()), zap.Error(err))
			}
		}
		return nil
	case errors.Is(err, lockstore.ErrBusy):
		return nil
	case errors.Is(err, lockstore.ErrInvalidLease):
		return &unmirrorableError{why: fmt.Sprintf("the document's lock ends at %s, later than lockstore.maxLeaseMS allows", d.ends.UTC().Format(time.RFC3339))}
	}
	return err
}

// holding is what this proxy keeps of a lockDocument lock it saw
// taken: the client identity that took it and the holder value, so that
// the writes of that client which name no holder (Tharga.MongoDB's
// abandon by _id) can be bound to the lock.
type holding struct {
	session []byte
	bind    string
	holder  bsoncore.Value
	token   int64
}

// holdings is the proxy's memory of holding, by mirror key; it
// forgets the oldest first, and a forgotten lock's holder must then name
// its holder value.
func (s *mirrorKeys) holdings() *lru.Cache[docid.Key, holding] {
	s.memoOnce.Do(func() { s.memo, _ = lru.New[docid.Key, holding](1 << 16) })
	return s.memo
}

// sameIdentity reports whether h was taken by client identity o.
func (h holding) sameIdentity(o lockstore.Owner) bool {
	return bytes.Equal(h.session, o.Session) && h.bind == o.Bind
}
