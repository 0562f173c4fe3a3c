// Package policy says which namespaces lockgate protects and how, and reads
// a client message, once, as the namespaces it touches and the writes it
// performs.
//
// Rules (policy.go) are compiled from the configuration into an immutable
// Policy; a reload replaces it whole. NewPlan (plan.go) walks a request
// once into its Plan: every namespace it names (references.go; an
// aggregation pipeline's stages in pipeline.go, where the classifier's
// scan for $out and $merge rides the same reading) or writes, the
// aggregation stages it runs, and its writes; every stage of the guard
// reads that one plan. Classification (classify.go and its
// companions) is pure: Classify turns a decoded message into Writes, with
// the documents each can touch where the filter pins them (PinnedIDs,
// UpsertID, InsertID), and EditMessage (edit.go), the one statement editor,
// pins a forwarded message to verified ids, fences it and caps its
// maxTimeMS, encoding it once.
//
// Contracts: classification never guesses. A message that is, or may be, a
// write it cannot read with certainty is a *ClassifyError naming the widest
// namespace it could reach, so that the caller refuses it wherever that is
// protected. The package does no I/O and holds no state; everything in it is
// safe for concurrent use. It never decides an outcome: that is the guard's.
package policy
