package lockstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// InstancesSuffix names the collection, next to Config.Collection, in
// which the Stores sharing a lock database announce themselves.
const InstancesSuffix = "_instances"

// The insert check (MayHoldLocks) answers "no lock here" from a view of the
// held namespaces that may be up to CacheTrust old. A lock taken through
// another Store since that view was read is not in it, so the view is
// trusted only by a Store that knows it is alone: every Store writes a
// heartbeat record here, and one whose last read found another live record
// reads the lock store on every insert instead. That leaves two ways for a
// lock to be granted unseen, both closed here:
//
//   - a Store that starts while another one trusts an "alone" view: the
//     newcomer grants nothing until that view has surely aged out
//     (CacheTrust after its own record was written; Open waits for it),
//     unless it found nobody else registered, in which case nobody trusts
//     such a view;
//   - a Store whose heartbeats stopped reaching the database while it still
//     grants locks, so that the others stop counting it: it grants only
//     while its last heartbeat is younger than instanceSelfFence, far inside
//     instanceLiveFor, the age at which the others stop counting it.
const (
	// instanceLiveFor is how long after its last heartbeat (in the lock
	// store server's time) a Store still counts as another instance.
	instanceLiveFor = 30 * time.Second
	// instanceSelfFence is how old a Store's own last successful
	// heartbeat may be for it to grant a lock or trust its view; the gap to
	// instanceLiveFor absorbs clock estimate errors and slow round trips.
	instanceSelfFence = 10 * time.Second
)

// errNotRegistered is why a grant is refused while the Store's heartbeat
// cannot be written.
var errNotRegistered = errors.New("this lockgate could not announce itself in the lock store (heartbeat)")

// instanceRegistry is this Store's side of the registry.
type instanceRegistry struct {
	mu sync.Mutex
	// beat is the local time at which the last successful heartbeat was
	// sent; zero before the first.
	beat time.Time
	// grantAfter is the local time from which this Store may grant locks:
	// CacheTrust after its first heartbeat if others were registered then.
	grantAfter time.Time
	// aloneSince is the local time at which the last read of the registry
	// that found no other live Store was sent; zero when the last read
	// found one (or failed).
	aloneSince time.Time
	// aloneFrom is aloneSince when the current run of reads that found no
	// other live Store began; zero when the last read found one (or
	// failed). Memory locks need the claims read since then (memlock.go).
	aloneFrom time.Time
	// read is the local time at which the last successful read of the
	// registry was sent.
	read time.Time
}

// instanceDoc is one Store's record.
type instanceDoc struct {
	ID      string    `bson:"_id"`
	Seen    time.Time `bson:"seen"`
	Started time.Time `bson:"started"`
	App     string    `bson:"app,omitempty"`
}

// heartbeat writes this Store's record and reads whether any other Store
// is live, in two round trips. first is true during setup.
func (s *Store) heartbeat(ctx context.Context, first bool) error {
	if s.cfg.CacheTrust <= 0 {
		return nil // no view is trusted, nothing to announce
	}
	now, _ := s.clock.Now()
	sent := time.Now()
	err := s.rt(ctx, opInstances, func(ctx context.Context) error {
		_, err := s.instances.UpdateOne(ctx, bson.D{{Key: "_id", Value: s.via}},
			bson.D{
				{Key: "$set", Value: bson.D{{Key: "seen", Value: now}, {Key: "app", Value: s.cfg.AppName}}},
				{Key: "$setOnInsert", Value: bson.D{{Key: "started", Value: now}}},
			}, options.Update().SetUpsert(true))
		return err
	})
	if err != nil {
		s.reg.mu.Lock()
		s.reg.aloneSince, s.reg.aloneFrom = time.Time{}, time.Time{}
		s.reg.mu.Unlock()
		return s.storeErr(ctx, opInstances, err)
	}
	// A Store whose read of the registry missed this record ran that read
	// before the write landed, so before now: its trust in being alone
	// ends before acked + CacheTrust, and its memory locks' writes before
	// acked + NewcomerHorizon (counting from sent would be short by this
	// round trip).
	acked := time.Now()
	s.reg.mu.Lock()
	s.reg.beat = sent
	s.reg.mu.Unlock()

	readSent := time.Now()
	now, unc := s.clock.Now()
	var other instanceDoc
	err = s.rt(ctx, opInstances, func(ctx context.Context) error {
		return s.instances.FindOne(ctx, bson.D{
			{Key: "_id", Value: bson.D{{Key: "$ne", Value: s.via}}},
			{Key: "seen", Value: bson.D{{Key: "$gt", Value: now.Add(-unc - instanceLiveFor)}}},
		}).Decode(&other)
	})
	alone := errors.Is(err, mongo.ErrNoDocuments)
	if err != nil && !alone {
		s.reg.mu.Lock()
		s.reg.aloneSince, s.reg.aloneFrom = time.Time{}, time.Time{}
		s.reg.mu.Unlock()
		return s.storeErr(ctx, opInstances, err)
	}
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	s.reg.read = readSent
	if alone {
		if s.reg.aloneSince.IsZero() {
			s.reg.aloneFrom = readSent
		}
		s.reg.aloneSince = readSent
	} else {
		s.reg.aloneSince, s.reg.aloneFrom = time.Time{}, time.Time{}
	}
	if first && s.reg.grantAfter.IsZero() {
		if alone {
			// Nobody else is registered, so nobody trusts an "alone" view:
			// a Store registering later finds this record and does not
			// trust one either.
			s.reg.grantAfter = sent
		} else {
			s.reg.grantAfter = acked.Add(s.grantHorizon())
		}
	}
	return nil
}

// maxStartWait bounds the wait for the first grant that Open does itself.
const maxStartWait = 5 * time.Second

// grantWait is how long from now this Store may not grant yet.
func (s *Store) grantWait() time.Duration {
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	return time.Until(s.reg.grantAfter)
}

// mayGrant waits until this Store may grant a lock to a new holder: no
// other Store's "alone" view can be missing it. It fails when the
// heartbeat cannot be written.
func (s *Store) mayGrant(ctx context.Context) error {
	if s.cfg.CacheTrust <= 0 {
		return nil
	}
	s.reg.mu.Lock()
	beat, after := s.reg.beat, s.reg.grantAfter
	s.reg.mu.Unlock()
	if after.IsZero() || time.Since(beat) > instanceSelfFence {
		if err := s.heartbeat(ctx, after.IsZero()); err != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, errNotRegistered)
		}
		s.reg.mu.Lock()
		after = s.reg.grantAfter
		s.reg.mu.Unlock()
		if after.IsZero() {
			return fmt.Errorf("%w: %w", ErrUnavailable, errNotRegistered)
		}
	}
	d := time.Until(after)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.ctx.Done():
		return ErrClosed
	}
}

// alone tells whether this Store may trust its view of the held
// namespaces now: its last read of the registry, at most CacheTrust ago,
// found no other live Store, and its own heartbeat is recent enough that a
// newcomer counts it. A Store that registers after that read waits
// CacheTrust before its first grant, so any lock it grants comes after
// this answer expires; one registered before it was seen.
func (s *Store) alone(now time.Time) bool {
	_, ok := s.aloneRead(now)
	return ok
}

// aloneRead returns when the read of the registry that the answer "alone"
// rests on was sent, and whether alone holds now.
func (s *Store) aloneRead(now time.Time) (time.Time, bool) {
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	ok := !s.reg.aloneSince.IsZero() &&
		now.Sub(s.reg.aloneSince) <= s.cfg.CacheTrust &&
		now.Sub(s.reg.beat) <= instanceSelfFence
	return s.reg.aloneSince, ok
}

// aloneFrom is when the current run of "alone" reads began (zero: none).
func (s *Store) aloneFrom() time.Time {
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	return s.reg.aloneFrom
}

// deregister removes this Store's record at Close, so that the others
// trust their views again at once instead of after instanceLiveFor.
func (s *Store) deregister(ctx context.Context) {
	if s.cfg.CacheTrust <= 0 || s.instances == nil {
		return
	}
	if s.memWritesMayRun() {
		// A write under a memory lock may still run: a newcomer that
		// found no record would grant at once, so the record stays and
		// ages out (a newcomer meanwhile waits NewcomerHorizon).
		return
	}
	_ = s.rt(ctx, opInstances, func(ctx context.Context) error {
		_, err := s.instances.DeleteOne(ctx, bson.D{{Key: "_id", Value: s.via}})
		return err
	})
}
