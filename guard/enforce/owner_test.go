package enforce

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/lockgate/lockgate/proxy"
	"go.mongodb.org/mongo-driver/bson"
)

// TestOwnerKeyCache: a remembered owner key is the keyed hash itself, one
// per (user, lsid), the memory stays bounded, and concurrent writers share
// the cache safely (run with -race).
func TestOwnerKeyCache(t *testing.T) {
	k := NewOwnerKeys([]byte("0123456789abcdef0123456789abcdef"))
	lsid := func(i int) []byte { return []byte(fmt.Sprintf("%016d", i)) }
	for i := range 3 {
		for _, user := range []string{"", "alice", "bob"} {
			first := k.Session(user, lsid(i))
			if again := k.Session(user, lsid(i)); !bytes.Equal(first, again) || !bytes.Equal(first, k.derive(user, lsid(i))) {
				t.Fatalf("user %q lsid %d: remembered key differs from the derived one", user, i)
			}
		}
	}
	if bytes.Equal(k.Session("alice", lsid(1)), k.Session("bob", lsid(1))) {
		t.Fatal("two users share an owner key for one lsid")
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range maxKnownOwners/2 + 100 {
				if got := k.Session("u", lsid(w*maxKnownOwners+i)); len(got) != 16 {
					t.Errorf("key of %d bytes", len(got))
					return
				}
			}
		}()
	}
	wg.Wait()
	k.mu.Lock()
	n := len(k.known)
	k.mu.Unlock()
	if n > maxKnownOwners {
		t.Fatalf("%d owner keys remembered, bound %d", n, maxKnownOwners)
	}
}

// TestOwnerDerivation: the owner a write acts as is the keyed hash of its
// user and session (another user, session or secret is another owner),
// with its client's address and the hashed binding its comment names.
func TestOwnerDerivation(t *testing.T) {
	a := NewOwnerKeys(bytes.Repeat([]byte("a"), MinOwnerSecret))
	b := NewOwnerKeys(bytes.Repeat([]byte("b"), MinOwnerSecret))
	s1, s2 := bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 16)
	if bytes.Equal(a.Session("", s1), a.Session("", s2)) || bytes.Equal(a.Session("", s1), b.Session("", s1)) ||
		bytes.Equal(a.Session("u", s1), a.Session("", s1)) {
		t.Fatal("two identities share an owner key")
	}
	if bytes.Contains(a.Session("", s1), s1[:4]) {
		t.Fatal("the owner key shows the session id")
	}
	c := &proxy.ClientInfo{ID: 1, Addr: "127.0.0.1:5000"}
	o := a.Owner(c, a.Session("", s1), "job-7")
	if o.Client != c.Addr || !bytes.Equal(o.Session, a.Session("", s1)) || o.Bind != a.Bind("job-7") || o.Bind == "job-7" || o.Bind == "" {
		t.Fatalf("owner %+v", o)
	}
	if a.Bind("") != "" {
		t.Fatal("no binding became one")
	}

	for _, s := range []struct {
		comment any
		want    string
	}{
		{"lockgate:job-7", "job-7"},
		{bson.D{{Key: "lockgate", Value: "job-7"}}, "job-7"},
		{"job-7", ""},
		{bson.D{{Key: "other", Value: "job-7"}}, ""},
		{int32(7), ""},
		{nil, ""},
	} {
		body := bson.D{{Key: "update", Value: "c"}, {Key: "$db", Value: "db"}}
		if s.comment != nil {
			body = append(body, bson.E{Key: "comment", Value: s.comment})
		}
		if got := Binding(request(t, body).Command); got != s.want {
			t.Errorf("comment %v: binding %q, want %q", s.comment, got, s.want)
		}
	}
}

// TestOwnerKeyBindsTheUser: two users of the same length, in one lsid,
// are two owners, and so are a user and a longer lsid that together
// spell the same bytes. Mutants: the user left out of the keyed hash
// (TestOwnerKeyCache's users differ in length, which the length prefix
// alone told apart); the length prefix left out.
func TestOwnerKeyBindsTheUser(t *testing.T) {
	k := NewOwnerKeys(bytes.Repeat([]byte("k"), MinOwnerSecret))
	lsid := bytes.Repeat([]byte{5}, 16)
	if bytes.Equal(k.Session("alice@admin", lsid), k.Session("carol@admin", lsid)) {
		t.Fatal("two users of the same length share an owner key for one lsid")
	}
	moved := append([]byte("n"), lsid...) // "admin" + lsid as "admi" + ("n" + lsid)
	if bytes.Equal(k.Session("admin", lsid), k.Session("admi", moved)) {
		t.Fatal("moving a byte from the user to the lsid gives the same owner key")
	}
}
