package enforcement

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
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
// an 8-hex-digit holder tag) and never the holder's session id, in any
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
			ID     any `json:"id"`
			Holder struct {
				App    string `json:"app"`
				Client string `json:"client"`
				Tag    string `json:"tag"`
			} `json:"holder"`
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
		if l.Holder.App != "view-holder" || !strings.HasPrefix(l.Holder.Client, "127.0.0.1:") || !tag.MatchString(l.Holder.Tag) {
			t.Errorf("/locks shows the holder as %+v, want its application, client address and a holder tag", l)
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
	owner, ok := raw.Lookup("locks", "0", "holder").DocumentOK()
	if !ok {
		t.Fatalf("lockStatus: no holder in %v", raw)
	}
	if app, _ := owner.Lookup("app").StringValueOK(); app != "view-holder" {
		t.Errorf("lockStatus owner %v, want app view-holder", owner)
	}
	if c, _ := owner.Lookup("client").StringValueOK(); !strings.HasPrefix(c, "127.0.0.1:") {
		t.Errorf("lockStatus owner %v, want the holder's client address", owner)
	}
}

// TestTwoIDsOneNameEach: lockgate shows two short ids, the caller's own
// logical session (the lsid prefix) and a lock's holder tag (a prefix of
// the keyed owner hash, which is not derived from the lsid alone), and
// each goes by one name in every reply and view: "session" is only ever
// the lsid prefix, and the holder tag only ever sits under holder.tag
// (issue 26, item 2). Before, the acquire reply called the tag "owner"
// while refusals and lockStatus called it "session", next to the
// acquire reply's "session" that is another id.
func TestTwoIDsOneNameEach(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type party struct {
		db     *mongo.Database
		sc     context.Context
		prefix string // the lsid prefix
	}
	join := func(app string) party {
		t.Helper()
		c, err := mongo.Connect(ctx, options.Client().ApplyURI(proxyURI).SetAppName(app))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Disconnect(context.Background()) })
		sess, err := c.StartSession()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sess.EndSession(context.Background()) })
		_, lsid, ok := sess.ID().Lookup("id").BinaryOK()
		if !ok {
			t.Fatalf("the session id: %v", sess.ID())
		}
		return party{db: c.Database("shop"), sc: mongo.NewSessionContext(ctx, sess), prefix: hex.EncodeToString(lsid[:4])}
	}
	holder, writer := join("names-holder"), join("names-writer")

	acq, err := holder.db.RunCommand(holder.sc, bson.D{{Key: "acquireLock", Value: "protected"}, {Key: "ids", Value: bson.A{"names-1"}}, {Key: "leaseMS", Value: 60000}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := acq.Lookup("holder", "tag").StringValueOK()
	if !regexp.MustCompile(`^[0-9a-f]{8}$`).MatchString(tag) || tag == holder.prefix {
		t.Fatalf("acquire reply %v: want holder.tag, 8 hex digits other than the lsid prefix %s", acq, holder.prefix)
	}
	_, werr := writer.db.Collection("protected").UpdateOne(writer.sc, bson.D{{Key: "_id", Value: "names-1"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}})
	var se mongo.ServerError
	if !errors.As(werr, &se) {
		t.Fatalf("the write without the lock: %v, want a refusal", werr)
	}
	var ce mongo.CommandError
	var refusal bson.Raw
	var we mongo.WriteException
	switch {
	case errors.As(werr, &we):
		refusal = we.Raw
	case errors.As(werr, &ce):
		refusal = ce.Raw
	}
	if len(refusal) == 0 {
		t.Fatalf("the refusal carries no reply document: %v", werr)
	}
	if msg := werr.Error(); !strings.Contains(msg, "holder tag "+tag) || strings.Contains(msg, "session "+tag) {
		t.Errorf("the refusal's text: %s; want the holder named \"holder tag %s\"", msg, tag)
	}
	status, err := writer.db.RunCommand(writer.sc, bson.D{{Key: "lockStatus", Value: "protected"}, {Key: "ids", Value: bson.A{"names-1"}}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + gw.AdminAddr().String() + "/locks?ns=shop.protected")
	if err != nil {
		t.Fatal(err)
	}
	locks, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	// check walks a reply: every "session" is the caller's lsid prefix,
	// and the tag appears at holder.tag and nowhere else. It returns how
	// often the tag was found.
	check := func(where string, v any, prefix string) int {
		t.Helper()
		found := 0
		var walk func(path string, v any)
		walk = func(path string, v any) {
			switch v := v.(type) {
			case map[string]any:
				for k, x := range v {
					if k == "session" && x != prefix {
						t.Errorf("%s: %s.session = %v, want only ever the caller's lsid prefix %s", where, path, x, prefix)
					}
					walk(path+"."+k, x)
				}
			case []any:
				for i, x := range v {
					walk(fmt.Sprintf("%s.%d", path, i), x)
				}
			case string:
				if v == tag {
					if !strings.HasSuffix(path, ".holder.tag") {
						t.Errorf("%s: the holder tag is at %s, want holder.tag", where, path)
					}
					found++
				}
			}
		}
		walk("", v)
		return found
	}
	fromBSON := func(r bson.Raw) any {
		t.Helper()
		js, err := bson.MarshalExtJSON(r, false, false)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(js, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	var locksJSON any
	if err := json.Unmarshal(locks, &locksJSON); err != nil {
		t.Fatalf("/locks: %v\n%s", err, locks)
	}
	for _, c := range []struct {
		where  string
		v      any
		prefix string
	}{
		{"the acquire reply", fromBSON(acq), holder.prefix},
		{"the refusal", fromBSON(refusal), writer.prefix},
		{"lockStatus", fromBSON(status), writer.prefix},
		{"GET /locks", locksJSON, ""},
	} {
		if n := check(c.where, c.v, c.prefix); n != 1 {
			t.Errorf("%s names the holder tag %s %d times, want once (at holder.tag): %v", c.where, tag, n, c.v)
		}
	}
	if s, _ := acq.Lookup("session").StringValueOK(); s != holder.prefix {
		t.Errorf("acquire reply session %q, want the lsid prefix %s", s, holder.prefix)
	}
}
