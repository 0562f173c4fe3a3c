package gateway

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lockgate/lockgate/admin"
	"github.com/lockgate/lockgate/audittrail"
	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/mongo/writeconcern"
	"go.uber.org/zap"
)

// openAudit registers the trail's metrics (always, so that the series
// alerts name exist: at zero, capacity 0, without a trail) and opens the
// trail when audit.enabled: its key, its sinks (the directory recovered
// after a crash, the collection on a client of its own); the trail
// records the policy in force at start.
func (a *assembly) openAudit() error {
	c := a.cfg.Audit
	m := audittrail.NewMetrics()
	if err := a.register(m); err != nil {
		return err
	}
	if !c.Enabled {
		return nil
	}
	key, err := audittrail.KeyFromFile(c.KeyFile)
	if err != nil {
		return fmt.Errorf("audit.keyFile: %w", err)
	}
	instance := c.Instance
	if instance == "" {
		if instance, err = os.Hostname(); err != nil {
			return fmt.Errorf("audit.instance: empty, and the host name is unknown: %w", err)
		}
	}
	var coll *mongo.Collection
	if c.Collection.Name != "" {
		// A client of its own: the trail's last records (stop, the final
		// checkpoint) are written after the upstream's client is closed,
		// and a separate deployment has credentials of its own.
		uri := auditURI(a.cfg)
		co := options.Client().ApplyURI(uri).SetAppName("lockgate-audit").SetMaxPoolSize(4)
		if co.ServerSelectionTimeout == nil { // the URI's is the operator's
			co.SetServerSelectionTimeout(lockstore.DefaultOpTimeout)
		}
		a.auditClient, err = mongo.Connect(a.ctx, co)
		if err != nil {
			return fmt.Errorf("audit.collection.uri: %w", err)
		}
		client := a.auditClient
		a.cleanup = append(a.cleanup, func() error { return client.Disconnect(context.Background()) })
		coll = a.auditClient.Database(c.Collection.DB(a.cfg.Lockstore)).Collection(c.Collection.Name)
	}
	a.trail, err = audittrail.Open(audittrail.Options{
		Dir:                c.Dir,
		Collection:         coll,
		Instance:           instance,
		Key:                key,
		SegmentBytes:       c.SegmentMaxBytes,
		SegmentAge:         c.SegmentMaxAge.D(),
		CheckpointEvery:    c.CheckpointEvery,
		CheckpointInterval: c.CheckpointInterval.D(),
		BufferSize:         c.BufferRecords,
		Logger:             a.log.Named("audit"),
		Metrics:            m,
	})
	if err != nil {
		return err
	}
	a.auditColl, a.auditInstance = coll, instance
	a.cleanup = append(a.cleanup, a.trail.Close)
	a.trail.Append(audittrail.Event{Kind: audittrail.KindReload, Policy: a.pol.Version(), Detail: "policy at start"})
	a.log.Info("audit trail open", zap.String("dir", c.Dir), zap.String("collection", c.Collection.Name), zap.String("instance", instance))
	return nil
}

// closeAudit closes the trail (its stop record and final checkpoint),
// then the collection sink's client.
func (a *assembly) closeAudit() error {
	if a.trail == nil {
		return nil
	}
	err := a.trail.Close()
	if a.auditClient != nil {
		err = errors.Join(err, a.auditClient.Disconnect(context.Background()))
	}
	return err
}

// auditURI is the collection sink's deployment: its own, or the lock
// store's.
func auditURI(cfg *config.Config) string {
	switch {
	case cfg.Audit.Collection.URI != "":
		return cfg.Audit.Collection.URI
	case cfg.Lockstore.URI != "":
		return cfg.Lockstore.URI
	}
	return cfg.Upstream.URI
}

// auditReserved adds the trail collection and its head collection to the
// namespaces clients may not touch, when they are in the lock store's
// database (validation requires that on the upstream deployment).
func auditReserved(r guard.Reserved, cfg *config.Config) guard.Reserved {
	ac := cfg.Audit.Collection
	if !cfg.Audit.Enabled || ac.Name == "" || !strings.EqualFold(ac.DB(cfg.Lockstore), r.DB) {
		return r
	}
	r.Collections = append(slices.Clone(r.Collections), ac.Name, ac.Name+audittrail.HeadSuffix)
	return r
}

// historyQuery answers GET /audit/history from the trail's files, or from
// its collection (this instance's records) when it has no files.
func (a *assembly) historyQuery() func(ctx context.Context, f audittrail.Filter, fn func(*audittrail.Record) error) error {
	if dir := a.cfg.Audit.Dir; dir != "" {
		return func(_ context.Context, f audittrail.Filter, fn func(*audittrail.Record) error) error {
			return audittrail.Query(dir, f, fn)
		}
	}
	coll, instance := a.auditColl, a.auditInstance
	return func(ctx context.Context, f audittrail.Filter, fn func(*audittrail.Record) error) error {
		return audittrail.QueryCollection(ctx, coll, instance, f, fn)
	}
}

// auditedStore records the lock commands that change locks (acquire,
// renew, release, and the releases of ended sessions) in the trail, then
// answers as the store did. Reads (status, holds) pass through: they
// change nothing. Every other method is the store's own, so the guard
// finds the store's optional capabilities on it too.
type auditedStore struct {
	*lockstore.Store
	trail *audittrail.Trail
}

func (s *auditedStore) record(op string, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID, locks []lockstore.Lock, n int, err error) {
	ev := audittrail.Event{Kind: audittrail.KindLock, Time: time.Now(), Op: op, NS: ns.String(), IDs: ids,
		App: o.App, User: o.User, Client: o.Client, Holder: lockstore.SessionPrefix(o.Session), Verdict: audittrail.VerdictOK}
	if len(locks) > 0 {
		ev.IDs = make([]docid.ID, len(locks))
		ev.Tokens = make([]int64, len(locks))
		for i, l := range locks {
			ev.IDs[i], ev.Tokens[i] = l.ID, l.Token
		}
	}
	if n >= 0 {
		ev.Detail = strconv.Itoa(n) + " released"
	}
	if err != nil {
		ev.Verdict, ev.Detail = audittrail.VerdictFailed, err.Error()
	}
	s.trail.Append(ev)
}

func (s *auditedStore) Acquire(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID, lease, wait time.Duration) ([]lockstore.Lock, error) {
	locks, err := s.Store.Acquire(ctx, o, ns, ids, lease, wait)
	s.record("acquire", o, ns, ids, locks, -1, err)
	return locks, err
}

func (s *auditedStore) Renew(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID, lease time.Duration) ([]lockstore.Lock, error) {
	locks, err := s.Store.Renew(ctx, o, ns, ids, lease)
	s.record("renew", o, ns, ids, locks, -1, err)
	return locks, err
}

func (s *auditedStore) Release(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID, errText string) (int, error) {
	n, err := s.Store.Release(ctx, o, ns, ids, errText)
	s.record("release", o, ns, ids, nil, n, err)
	return n, err
}

func (s *auditedStore) ReleaseAll(ctx context.Context, o lockstore.Owner, ns namespace.Namespace, errText string) (int, error) {
	n, err := s.Store.ReleaseAll(ctx, o, ns, errText)
	s.record("releaseAll", o, ns, nil, nil, n, err)
	return n, err
}

func (s *auditedStore) ReleaseSession(ctx context.Context, session []byte) (int, error) {
	n, err := s.Store.ReleaseSession(ctx, session)
	if n > 0 || err != nil {
		s.record("releaseSession", lockstore.Owner{Session: session}, namespace.Namespace{}, nil, nil, n, err)
	}
	return n, err
}

// forceReleases records operator force-releases in the trail; nil without
// one. The record names the holder the lock was taken from (its app,
// user and tag, so that it shows in that holder's history) and, in its
// detail, the operator's address and reason.
func (a *assembly) forceReleases() func(ns namespace.Namespace, id docid.ID, reason, remote string, before lockstore.Status) {
	trail := a.trail
	if trail == nil {
		return nil
	}
	return func(ns namespace.Namespace, id docid.ID, reason, remote string, before lockstore.Status) {
		h := before.Holder
		trail.Append(audittrail.Event{Kind: audittrail.KindLock, Time: time.Now(), Op: "forceRelease", NS: ns.String(),
			IDs: []docid.ID{id}, Tokens: []int64{before.Token}, Verdict: audittrail.VerdictOK,
			App: h.App, User: h.User, Client: h.Client, Holder: h.SessionPrefix,
			Detail: fmt.Sprintf("force-released by the operator at %s: %s", remote, reason)})
	}
}

// expiries records in the trail the locks whose lease ended without a
// release, when the lock store takes them over or its expiry scan finds
// them: a lock record "expire" with the former holder's app, user,
// client and tag, and its token; nil without a trail.
func (a *assembly) expiries() func(lockstore.Expiry) {
	trail := a.trail
	if trail == nil {
		return nil
	}
	return func(e lockstore.Expiry) {
		h := e.Former
		detail := fmt.Sprintf("the lease ended at %s without a release; taken over by a new holder (token %d)",
			h.ExpiresAt.UTC().Format(time.RFC3339Nano), e.Token)
		if e.Scanned {
			detail = fmt.Sprintf("the lease ended at %s without a release or a renewal (found by this lockgate's expiry scan; not taken over)",
				h.ExpiresAt.UTC().Format(time.RFC3339Nano))
		}
		trail.Append(audittrail.Event{Kind: audittrail.KindLock, Time: e.At, Op: "expire", NS: e.NS.String(),
			IDs: []docid.ID{e.ID}, Tokens: []int64{h.Token}, Verdict: audittrail.VerdictOK,
			App: h.App, User: h.User, Client: h.Client, Holder: h.SessionPrefix, Detail: detail})
	}
}

// maxHistory bounds the records one GET /audit/history returns.
const maxHistory = 10000

// mountAuditHistory serves GET /audit/history: the trail's decision and
// lock records of one document (ns and id) or one holder (holder), in
// trail order, as `lockgate audit query` prints them. Each request reads
// the trail's files, so it needs a filter and runs one at a time (a
// second concurrent one is told to retry); it reads, it does not verify.
func mountAuditHistory(adm *admin.Server, query func(context.Context, audittrail.Filter, func(*audittrail.Record) error) error) {
	busy := make(chan struct{}, 1)
	adm.Handle("/audit/history", admin.JSON(func(r *http.Request) (any, error) {
		q := r.URL.Query()
		f := audittrail.Filter{NS: q.Get("ns"), ID: q.Get("id"), Holder: q.Get("holder"), User: q.Get("user"), App: q.Get("app")}
		if f == (audittrail.Filter{}) {
			return nil, admin.BadRequest(errors.New("name ns and id (a document's history), holder (a holder tag: its history), user or app"))
		}
		limit, err := queryLimit(q.Get("limit"))
		if err != nil {
			return nil, err
		}
		if limit == 0 || limit > maxHistory {
			limit = maxHistory
		}
		select {
		case busy <- struct{}{}:
			defer func() { <-busy }()
		default:
			return nil, errors.New("another history query is reading the trail; retry")
		}
		records := []*audittrail.Record{}
		truncated := false
		err = query(r.Context(), f, func(rec *audittrail.Record) error {
			if len(records) == limit {
				truncated = true
				return errStopQuery
			}
			records = append(records, rec)
			return r.Context().Err()
		})
		if err != nil && !errors.Is(err, errStopQuery) {
			return nil, err
		}
		return map[string]any{"records": records, "truncated": truncated}, nil
	}))
}

var errStopQuery = errors.New("enough records")

// probeAuditCollection is -check's test write of the trail's collection
// sink: a document inserted and deleted again, in the records'
// collection and in its head collection, with the write concern the
// sink's durable writes use. The sink needs both rights (it deletes what
// a failed batch left), and credentials that can only read would
// otherwise pass the check and fail the first batch, which in required
// mode refuses every write. The test document names an instance no
// lockgate uses ("lockgate-check-" and random hex); should its deletion
// fail, the error names it.
func probeAuditCollection(ctx context.Context, db *mongo.Database, name string) error {
	var tag [8]byte
	_, _ = crand.Read(tag[:])
	instance := "lockgate-check-" + hex.EncodeToString(tag[:])
	wc := options.Collection().SetWriteConcern(&writeconcern.WriteConcern{W: "majority", Journal: &[]bool{true}[0]})
	for _, p := range []struct {
		coll        string
		doc, filter bson.D
	}{
		{name, bson.D{{Key: "instance", Value: instance}, {Key: "seq", Value: int64(0)}, {Key: "kind", Value: "check"}}, bson.D{{Key: "instance", Value: instance}}},
		{name + audittrail.HeadSuffix, bson.D{{Key: "_id", Value: instance}, {Key: "kind", Value: "check"}}, bson.D{{Key: "_id", Value: instance}}},
	} {
		coll := db.Collection(p.coll, wc)
		if _, err := coll.InsertOne(ctx, p.doc); err != nil {
			return fmt.Errorf("test insert into %s.%s: %w", db.Name(), p.coll, err)
		}
		if _, err := coll.DeleteOne(ctx, p.filter); err != nil {
			return fmt.Errorf("deleting the test document {instance: %q} from %s.%s (remove it by hand): %w", instance, db.Name(), p.coll, err)
		}
	}
	return nil
}

// checkAudit is -check's look at the trail: its key readable and long
// enough, its directory a directory lockgate can write in (created if
// missing, as Start would).
func checkAudit(c config.Audit) error {
	if k, err := audittrail.KeyFromFile(c.KeyFile); err != nil {
		return fmt.Errorf("audit.keyFile: %w", err)
	} else if err := k.CanSign(); err != nil {
		return fmt.Errorf("audit.keyFile: %w", err)
	}
	if c.Dir == "" {
		return nil
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return fmt.Errorf("audit.dir: %w", err)
	}
	f, err := os.CreateTemp(c.Dir, ".check-*")
	if err != nil {
		return fmt.Errorf("audit.dir: not writable: %w", err)
	}
	f.Close()
	return os.Remove(f.Name())
}
