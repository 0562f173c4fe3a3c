// Package enforce is enforcement's own unit: for a write the stages
// before it passed, the walk over its statements (walk.go), the rule that
// applies to its client (rule.go), the lock owner it acts as (owner.go),
// the documents whose locks it needs (targets.go), whether its session
// holds them (lockcheck.go), what it found (verdict.go) and the decision
// and how a refusal reads (decide.go).
//
// It is built from explicit dependencies (the lock store's interfaces, a
// Resolver, the metrics it counts into, funcs for what the guard does
// around it: Walk, Checker and Decider take them, generic in the verdict
// the guard keeps around a Verdict) and imports nothing of package guard:
// the guard assembles it and keeps each connection's spare verdict, which
// the audit line, the fence, the launch and the transaction check read
// after the decision. Walk, Checker and Decider are shared once built;
// a Verdict is one request's. Everything else here is
// safe for concurrent use unless a type says it is a connection's own
// (Rules, HeldMemos, PinMemos: kept in the guard's per-connection or
// per-session memos, under their lock).
//
// It must never let a write through on an error: a lock store or a
// resolver that cannot answer is a refusal (fail closed), and a refusal
// never names a document the request did not name itself.
package enforce
