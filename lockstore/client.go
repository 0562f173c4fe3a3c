package lockstore

import "go.mongodb.org/mongo-driver/mongo"

// WithClient makes the Store use c, a client of the deployment that
// Config.URI names, instead of connecting one of its own: a proxy whose
// lock store is its upstream watches that deployment once. The caller
// owns c: Close leaves it connected. Config.AppName, MaxPoolSize and the
// client's server selection timeout are then c's; OpTimeout still bounds
// every round trip.
func WithClient(c *mongo.Client) Option { return func(s *Store) { s.client = c } }
