package guardtest

import (
	"reflect"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/lockgate/lockgate/proxy"
)

// SetIdentity gives c the application name and user a handshake and an
// authentication would, for a test of a decision that depends on them
// without a connection that makes them. proxy keeps them unexported (only
// its own handshake and authentication set them), so this writes the
// field through reflection, after checking that its layout is still the
// one written here: a change to proxy.ClientInfo fails the test that
// calls this, rather than writing the wrong memory.
func SetIdentity(t testing.TB, c *proxy.ClientInfo, app, user string) {
	t.Helper()
	type identity struct{ appName, driver, user string }
	f := reflect.ValueOf(c).Elem().FieldByName("id")
	if !f.IsValid() || f.Type().Size() != unsafe.Sizeof(atomic.Pointer[identity]{}) || f.Type().Name() != "Pointer[github.com/lockgate/lockgate/proxy.clientID]" {
		t.Fatalf("proxy.ClientInfo's identity is not an atomic pointer to clientID: %v", f)
	}
	id := f.Type().Field(0).Type.Elem().Elem() // the pointer's _ [0]*clientID
	want := []string{"appName", "driver", "user"}
	if id.Size() != unsafe.Sizeof(identity{}) || id.NumField() != len(want) {
		t.Fatalf("proxy.clientID is not %v: %v", want, id)
	}
	for i, name := range want {
		if id.Field(i).Name != name || id.Field(i).Type.Kind() != reflect.String {
			t.Fatalf("proxy.clientID is not %v: %v", want, id)
		}
	}
	(*atomic.Pointer[identity])(unsafe.Pointer(f.UnsafeAddr())).Store(&identity{appName: app, user: user})
	if c.AppName() != app || c.User() != user {
		t.Fatalf("set %q %q, the client says %q %q", app, user, c.AppName(), c.User())
	}
}
