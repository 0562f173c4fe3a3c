package authority

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/proxy"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

// TestAuthorityWithoutAnUpstream: where no authentication is required,
// anyone may see holders, and nothing is asked; where it is, an
// unauthenticated caller may not, a verdict remembered for the connection
// is used without asking again, and a question that cannot be asked is an
// error, never a yes. (Asking a real upstream: guard's auth tests.)
func TestAuthorityWithoutAnUpstream(t *testing.T) {
	ctx := context.Background()
	req := &proxy.Request{Client: &proxy.ClientInfo{ID: 1}}
	if open := New(nil); open.Required() || !open.MayDisclose(ctx, req, namespace.Of("shop.orders")) {
		t.Error("an upstream without authentication: holders must be shown to anyone")
	}
	required := true
	a := New(func() bool { return required })
	if !a.Required() {
		t.Fatal("Required() = false, want true")
	}
	if a.MayDisclose(ctx, req, namespace.Of("shop.orders")) {
		t.Error("holders shown to an unauthenticated caller where authentication is required")
	}
	if allowed, err := a.Allows(ctx, req, Write, namespace.Of("shop.orders")); !errors.Is(err, proxy.ErrNoUpstream) || allowed {
		t.Errorf("Allows without a connection = %v, %v; want false and the error", allowed, err)
	}
	req.Client.SetVerdict(string(Write)+" shop.orders", true)
	if allowed, err := a.Allows(ctx, req, Write, namespace.Of("shop.orders")); err != nil || !allowed {
		t.Errorf("Allows with the verdict remembered = %v, %v; want true without asking", allowed, err)
	}
	if allowed, err := a.Allows(ctx, req, Read, namespace.Of("shop.orders")); err == nil || allowed {
		t.Errorf("Allows(Read) after a Write verdict = %v, %v; the privileges must be remembered apart", allowed, err)
	}
}
