package lockstore

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"
)

// changeStream is the part of *mongo.ChangeStream the watcher uses; tests
// substitute a fake.
type changeStream interface {
	Next(ctx context.Context) bool
	Decode(v any) error
	Err() error
	Close(ctx context.Context) error
	ResumeToken() bson.Raw
}

// changeEvent is the part of a change event the watcher reads.
type changeEvent struct {
	DocumentKey struct {
		ID string `bson:"_id"`
	} `bson:"documentKey"`
	FullDocument *gen `bson:"fullDocument"`
}

// watchCollection opens a change stream on the lock collection: claims
// (inserts) and head documents (replacements, upserts).
func (s *Store) watchCollection(ctx context.Context) (changeStream, error) {
	pipeline := mongo.Pipeline{{{Key: "$match", Value: bson.D{
		{Key: "operationType", Value: bson.D{{Key: "$in", Value: bson.A{"insert", "replace", "update"}}}},
	}}}}
	var cs *mongo.ChangeStream
	err := s.rt(ctx, "watch", func(ctx context.Context) error {
		var err error
		cs, err = s.coll.Watch(ctx, pipeline, options.ChangeStream().SetFullDocument(options.UpdateLookup))
		return err
	})
	if err != nil {
		return nil, err
	}
	return cs, nil
}

// startWatcher runs the change-stream watcher if the first stream opens;
// otherwise waiters keep polling with backoff. Called once, from setup.
func (s *Store) startWatcher() {
	cs, err := s.openStream(s.ctx)
	if err != nil {
		s.log.Info("change streams unavailable; waiters poll with backoff", zap.Error(err))
		return
	}
	s.log.Info("waiters are woken by a change stream on the lock collection")
	s.streamActive.Store(true)
	s.wg.Add(1)
	go s.watch(cs)
}

// watch dispatches change events until Close: every change to a record
// wakes the first local waiter for it (which then tries once), and drops a
// cache entry that no longer matches the record. When the stream fails it
// is reopened with backoff; meanwhile waiters poll at the normal cap.
func (s *Store) watch(cs changeStream) {
	defer s.wg.Done()
	bo := newBackoff(100*time.Millisecond, 30*time.Second)
	for {
		for cs.Next(s.ctx) {
			var ev changeEvent
			if err := cs.Decode(&ev); err != nil || ev.DocumentKey.ID == "" {
				continue
			}
			s.onChange(ev)
			bo.reset()
		}
		err := cs.Err()
		_ = cs.Close(context.Background())
		s.streamActive.Store(false)
		if s.ctx.Err() != nil {
			return
		}
		s.log.Warn("lock change stream failed; polling until it is back", zap.Error(err))
		for {
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(bo.next()):
			}
			next, err := s.openStream(s.ctx)
			if err == nil {
				cs = next
				s.streamActive.Store(true)
				// Anything may have changed while we were away.
				s.cache.staleAll()
				break
			}
		}
	}
}

func (s *Store) onChange(ev changeEvent) {
	rid := keyOfGenID(ev.DocumentKey.ID)
	if ev.FullDocument != nil && ev.FullDocument.Key != "" {
		rid = ev.FullDocument.Key
	}
	if rid == "" {
		return
	}
	if e, ok := s.cache.get(rid); ok {
		// A generation this Store did not write (or a newer one) makes the
		// cached head stale.
		if g := ev.FullDocument; g == nil || g.Seq > e.g.Seq {
			s.cache.remove(rid)
		}
	}
	s.wq.notify(rid)
}
