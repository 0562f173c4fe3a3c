package mongoerr

import (
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

func TestEveryAnsweredCodeIsNamedAndNoRefusalIsRetried(t *testing.T) {
	for _, c := range append(Answered(), AuthenticationFailed, IndexNotFound, MaxTimeMSExpired, CommandNotFound, IndexOptionsConflict) {
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

func TestWriteError(t *testing.T) {
	info := bsoncore.AppendDocumentElement(nil, "errInfo", bsoncore.NewDocumentBuilder().AppendString("reason", "r").Build())
	d := New(DuplicateKey, "E11000 duplicate key error").WriteError(3, info)
	var got struct {
		Index    int32  `bson:"index"`
		Code     int32  `bson:"code"`
		CodeName string `bson:"codeName"`
		Errmsg   string `bson:"errmsg"`
		ErrInfo  struct {
			Reason string `bson:"reason"`
		} `bson:"errInfo"`
	}
	if err := bson.Unmarshal(d, &got); err != nil {
		t.Fatal(err)
	}
	if got.Index != 3 || got.Code != int32(DuplicateKey) || got.CodeName != "DuplicateKey" ||
		got.Errmsg != "E11000 duplicate key error" || got.ErrInfo.Reason != "r" {
		t.Fatalf("write error %v", bson.Raw(d))
	}
	if _, err := d.LookupErr("ok"); err == nil {
		t.Fatalf("a write error is no command reply: %v", bson.Raw(d))
	}
}
