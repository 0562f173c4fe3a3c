// Package lockgate is the Go client helper for lockgate's lock commands:
// it takes document locks in an explicit session, keeps them alive in the
// background, says when they are lost, and maps lockgate's error replies to
// typed errors.
//
//	sess, _ := client.StartSession()
//	defer sess.EndSession(ctx)
//	err := lockgate.WithLock(ctx, sess, orders, []any{42}, nil, func(ctx mongo.SessionContext, l *lockgate.Lock) error {
//		_, err := orders.UpdateOne(ctx, bson.M{"_id": 42}, bson.M{"$set": bson.M{"paid": true, "fence": l.Token()}})
//		return err
//	})
//
// What it guarantees:
//   - every lock command runs in the caller's logical session (the same lsid
//     its writes carry), never in an implicit one; a nil session is refused;
//   - a held Lock is renewed every Options.RenewEvery until Release, until
//     the Acquire context ends, or until it is lost; Lost is closed, and the
//     Lock's Context cancelled, as soon as a renewal is refused or the lease
//     can no longer be renewed before it ends (measured on this process's
//     monotonic clock from the moment each renewal was sent, which is never
//     later than the lock store's own lease end);
//   - only what may be retried is retried: network errors and
//     lockstore_unavailable refusals (lock commands are idempotent for the
//     session that sends them), never LockBusy held, LockTimeout or
//     LockFailed not_holder.
//
// Concurrency: the driver's mongo.Session is not safe for concurrent use,
// and renewals run on their own goroutine while the caller writes in the
// session. So the helper never sends anything through the caller's Session
// value: it starts a session of its own on the same client and points it
// at the caller's logical session id (the driver's XSession view), so that
// its commands carry the caller's lsid while its bookkeeping (cluster time,
// last use) stays separate. The caller's session is only read, once, in
// Acquire. Lock's methods are safe for concurrent use.
//
// The helper must never end or reuse the caller's session: end it yourself
// after Release (docs/LOCKS.md, "the session-pooling hazard").
package lockgate
