package lockgate

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
)

func reply(code int32, name, reason string) error {
	doc := bson.D{{Key: "ok", Value: 0}, {Key: "code", Value: code}, {Key: "codeName", Value: name}, {Key: "errmsg", Value: "x"}}
	if reason != "" {
		doc = append(doc, bson.E{Key: "lockgate", Value: bson.D{{Key: "reason", Value: reason}, {Key: "ns", Value: "kit.x"},
			{Key: "ids", Value: bson.A{1}}, {Key: "holder", Value: bson.D{{Key: "app", Value: "billing"}, {Key: "session", Value: "ab12cd34"}}}}})
	}
	raw, _ := bson.Marshal(doc)
	return fmt.Errorf("wrapped: %w", mongo.CommandError{Code: code, Name: name, Message: "x", Raw: raw})
}

// Every lockgate code maps to its sentinel and to nothing else, and only
// the failures that may be retried are.
func TestErrorMapping(t *testing.T) {
	sentinels := []error{ErrBusy, ErrTimeout, ErrNotHeld, ErrUnavailable, ErrInvalid, ErrUnauthorized, ErrNotProtected}
	for _, tc := range []struct {
		err       error
		want      error
		retryable bool
	}{
		{reply(46, "LockBusy", "held"), ErrBusy, false},
		{reply(46, "LockBusy", "too_many_waiters"), ErrBusy, false},
		{reply(46, "LockBusy", "lockstore_unavailable"), ErrUnavailable, true},
		{reply(24, "LockTimeout", "timeout"), ErrTimeout, false},
		{reply(107, "LockFailed", "not_holder"), ErrNotHeld, false},
		{reply(107, "LockFailed", "in_flight"), nil, true},
		{reply(2, "BadValue", "bad_argument"), ErrInvalid, false},
		{reply(40415, "IDLUnknownField", ""), ErrInvalid, false},
		{reply(13, "Unauthorized", "reserved"), ErrUnauthorized, false},
		{reply(59, "CommandNotFound", ""), ErrNotProtected, false},
		{reply(46, "LockBusy", "internal"), nil, false},
	} {
		err := fromCommand("acquireLock", tc.err)
		for _, s := range sentinels {
			if got := errors.Is(err, s); got != (s == tc.want) {
				t.Errorf("%v: errors.Is(%v) = %v", err, s, got)
			}
		}
		if got := retryable(err); got != tc.retryable {
			t.Errorf("%v: retryable = %v, want %v", err, got, tc.retryable)
		}
	}
	var e *Error
	if err := fromCommand("acquireLock", reply(46, "LockBusy", "held")); !errors.As(err, &e) || e.Holder == nil || e.Holder.App != "billing" || e.NS != "kit.x" || len(e.IDs) != 1 {
		t.Errorf("detail not read: %+v", e)
	}
	if retryable(context.Canceled) || !retryable(context.DeadlineExceeded) {
		t.Error("a cancelled call is not retried; a timed-out attempt is")
	}
}
