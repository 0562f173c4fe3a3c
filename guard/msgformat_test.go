package guard

import (
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/bson"
)

// TestLeaseErrorsSpeakMilliseconds: lock commands take milliseconds, and
// an over-long leaseMS was refused with Go durations ("lease 277h46m40s
// exceeds the maximum 10m0s", issue 26). The refusal repeats the caller's
// own number and the maximum in milliseconds, naming the setting.
func TestLeaseErrorsSpeakMilliseconds(t *testing.T) {
	s := startStack(t, "")
	c := connect(t, s.uri, "ms-app")
	sess := session(t, c)
	_, err := run(t, c, sess, bson.D{{Key: "acquireLock", Value: "orders"}, {Key: "ids", Value: bson.A{1}}, {Key: "leaseMS", Value: int64(1000000000)}})
	if err == nil {
		t.Fatal("a lease over lockstore.maxLeaseMS was granted")
	}
	msg := err.Error()
	if !strings.Contains(msg, "lease 1000000000 ms exceeds the maximum (lockstore.maxLeaseMS) of 60000 ms") || strings.Contains(msg, "277h") || strings.Contains(msg, "1m0s") {
		t.Errorf("refusal %q, want the lease and the maximum in milliseconds", msg)
	}
}
