package enforce

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
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
