// Package guard is lockgate's proxy.Interceptor: it decides, for each
// client request, whether the proxy answers it itself, forwards it, or
// refuses it.
//
// It answers the lock commands (acquireLock, renewLock, releaseLock,
// lockStatus) from the lock store and never forwards them, so that behind
// no proxy MongoDB answers CommandNotFound and an application can tell it
// is unprotected. It releases the locks of sessions a driver ends.
//
// Every refusal is an ordinary MongoDB error reply with code, codeName, an
// errmsg that tells a person what to do, and a "lockgate" detail document
// for programs; errors.go is the one place where failures become codes, and
// none of the codes is one that drivers retry by themselves.
package guard
