package guardtest_test

import (
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
)

// legacySession is session b's id bytes as a legacy UUID (binary subtype
// 3), which MongoDB refuses as a session id: only subtype 4 is one.
func legacySession(b byte) bson.D {
	id := make([]byte, 16)
	id[0] = b
	return bson.D{{Key: "id", Value: primitive.Binary{Subtype: 3, Data: id}}}
}

// TestSessionIDIsAUUID: every place the guard reads a session id accepts
// what the server accepts, binary subtype 4 of 16 bytes, and nothing else.
// A subtype 3 id with a session's bytes is not that session: its write is
// refused for want of a session (the server would refuse it too), and an
// endSessions naming it (which the server refuses) releases nothing.
func TestSessionIDIsAUUID(t *testing.T) {
	h := newHarness(t)
	h.lock(t, sessA, 1)
	if got := outcome(t, h.intercept(t, msg(t, cmd("update", "orders", legacySession(0xa),
		bson.E{Key: "updates", Value: bson.A{update(id(1))}})))); got != "no_session" {
		t.Errorf("a write with session A's id as subtype 3: %s, want no_session", got)
	}
	h.intercept(t, msg(t, bson.D{{Key: "endSessions", Value: bson.A{legacySession(0xa)}}, {Key: "$db", Value: "admin"}}))
	if got := outcome(t, h.intercept(t, msg(t, cmd("update", "orders", sessA,
		bson.E{Key: "updates", Value: bson.A{update(id(1))}})))); got != "forward" && got != "rewrite" {
		t.Errorf("session A's write after an endSessions of its id as subtype 3: %s, want it allowed (the lock still held)", got)
	}
}
