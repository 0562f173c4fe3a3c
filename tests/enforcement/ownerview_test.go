package enforcement

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// TestHolderShownWithoutItsSessionID: the admin view (/locks) and another
// session's lockStatus show who holds a lock (application, client address,
// an 8-hex-digit owner tag) and never the holder's session id, in any
// encoding (issue 10, item 2).
func TestHolderShownWithoutItsSessionID(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holder, err := mongo.Connect(ctx, options.Client().ApplyURI(proxyURI).SetAppName("view-holder"))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Disconnect(context.Background())
	sess, err := holder.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(ctx)
	sctx := mongo.NewSessionContext(ctx, sess)
	if err := holder.Database("shop").RunCommand(sctx, bson.D{{Key: "acquireLock", Value: "protected"}, {Key: "ids", Value: bson.A{"view-1"}}, {Key: "leaseMS", Value: 60000}}).Err(); err != nil {
		t.Fatal(err)
	}
	_, lsid, ok := sess.ID().Lookup("id").BinaryOK()
	if !ok || len(lsid) != 16 {
		t.Fatalf("the session id: %v", sess.ID())
	}
	secrets := []string{hex.EncodeToString(lsid), base64.StdEncoding.EncodeToString(lsid), hex.EncodeToString(lsid[:8])}
	leaks := func(where, text string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(strings.ToLower(text), strings.ToLower(s)) || strings.Contains(text, s) {
				t.Errorf("%s shows the holder's session id (%s): %s", where, s, text)
			}
		}
	}
	tag := regexp.MustCompile(`^[0-9a-f]{8}$`)

	resp, err := http.Get("http://" + gw.AdminAddr().String() + "/locks")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	leaks("/locks", string(body))
	var view struct {
		Locks []struct {
			ID          any    `json:"id"`
			OwnerApp    string `json:"ownerApp"`
			OwnerClient string `json:"ownerClient"`
			OwnerTag    string `json:"ownerTag"`
		} `json:"locks"`
	}
	if err := json.Unmarshal(body, &view); err != nil {
		t.Fatalf("/locks: %v\n%s", err, body)
	}
	found := false
	for _, l := range view.Locks {
		if l.ID != "view-1" {
			continue
		}
		found = true
		if l.OwnerApp != "view-holder" || !strings.HasPrefix(l.OwnerClient, "127.0.0.1:") || !tag.MatchString(l.OwnerTag) {
			t.Errorf("/locks shows the holder as %+v, want its application, client address and an owner tag", l)
		}
	}
	if !found {
		t.Fatalf("/locks does not list the lock:\n%s", body)
	}

	other := goClient(t, proxyURI)
	raw, err := other.Database("shop").RunCommand(ctx, bson.D{{Key: "lockStatus", Value: "protected"}, {Key: "ids", Value: bson.A{"view-1"}}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	leaks("lockStatus", raw.String())
	owner, ok := raw.Lookup("locks", "0", "owner").DocumentOK()
	if !ok {
		t.Fatalf("lockStatus: no owner in %v", raw)
	}
	if app, _ := owner.Lookup("app").StringValueOK(); app != "view-holder" {
		t.Errorf("lockStatus owner %v, want app view-holder", owner)
	}
	if c, _ := owner.Lookup("client").StringValueOK(); !strings.HasPrefix(c, "127.0.0.1:") {
		t.Errorf("lockStatus owner %v, want the holder's client address", owner)
	}
}
