package mongoerr

import (
	"testing"

	"go.mongodb.org/mongo-driver/bson"
)

func TestEveryAnsweredCodeIsNamedAndNoRefusalIsRetried(t *testing.T) {
	for _, c := range append(Answered(), AuthenticationFailed, MaxTimeMSExpired, CommandNotFound) {
		if c.Name() == "" {
			t.Errorf("code %d has no name", int32(c))
		}
	}
	for _, c := range Answered() {
		// HostUnreachable is no refusal: nothing was sent, and a retry is
		// what should happen.
		if c.Retryable() && c != HostUnreachable {
			t.Errorf("lockgate answers with %v, which drivers retry on their own", c)
		}
	}
}

func TestDocument(t *testing.T) {
	d := New(LockBusy, "lockgate: %s is held", "1").Document()
	var got struct {
		OK       float64 `bson:"ok"`
		Errmsg   string  `bson:"errmsg"`
		Code     int32   `bson:"code"`
		CodeName string  `bson:"codeName"`
	}
	if err := bson.Unmarshal(d, &got); err != nil {
		t.Fatal(err)
	}
	if got.OK != 0 || got.Errmsg != "lockgate: 1 is held" || got.Code != 46 || got.CodeName != "LockBusy" {
		t.Errorf("document %v", bson.Raw(d))
	}
}
