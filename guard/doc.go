// Package guard is lockgate's proxy.Interceptor: it decides, for each
// client request, whether the proxy answers it itself, forwards it, or
// refuses it.
//
// It answers the lock commands (acquireLock, renewLock, releaseLock,
// lockStatus) from the lock store (package guard/lockcmd) and never
// forwards them, so that behind no proxy MongoDB answers CommandNotFound
// and an application can tell it is unprotected. It releases the locks of sessions a driver ends.
//
// Every refusal is an ordinary MongoDB error reply with code, codeName, an
// errmsg that tells a person what to do, and a "lockgate" detail document
// for programs; package guard/refuse is the one place where failures become
// codes, and none of the codes is one that drivers retry by themselves.
//
// The guard is a chain of stages (Guard.Stages, docs/ARCHITECTURE.md):
// the boundary (package guard/boundary), the lock commands (package
// guard/lockcmd), the sessions (package guard/sessions, with the
// transaction check, package guard/txn) and enforcement (enforce.go, with
// its unit, package guard/enforce: the walk over a request's writes, the
// rule, the owner, the targets, the lock check, the verdict and the
// decision; and the locking schemes, package guard/scheme). This package
// assembles enforcement's walk with what acts around it (the implicit
// locks, the fence, the launch, the audit record, the transaction's
// record) and keeps, per connection, the verdict (verdict.go:
// enforce.Verdict with the fence, flight and implicit plans).
//
// The stage packages, and the units below them (guard/enforce for
// enforcement, guard/authority for what a caller may do, guard/inflight
// for the writes in flight, guard/fence for the document fence's reply
// check, guard/txn for the transaction check, guard/scheme for the
// locking schemes, guard/refuse for refusals, guard/reqplan for the
// request's plan), are built from explicit dependencies and import
// nothing of this package;
// this package builds them in New.
//
// Every decision on an audited or enforced namespace is counted, and logged
// at info as one line on the "audit" logger with the ids it checked or
// refused: that line is the compliance record, so it names ids where other
// logs keep them at debug. Its fields are built only when the line is
// written.
package guard
