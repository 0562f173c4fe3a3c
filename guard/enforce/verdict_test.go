package enforce

import (
	"testing"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
)

// TestNamedIsPerNamespace: an id is named where the request named it,
// whether few ids are named (compared one by one) or many (indexed), and
// ids named after an earlier question are still found.
func TestNamedIsPerNamespace(t *testing.T) {
	for _, many := range []int{3, 40} {
		var v Verdict
		var a []docid.ID
		for i := range many {
			a = append(a, id(t, i))
		}
		v.Name(namespace.Of("shop.orders"), a)
		v.NameOne(namespace.Of("shop.invoices"), id(t, 1000))
		if !v.IsNamed(namespace.Of("shop.orders"), id(t, many-1)) || !v.IsNamed(namespace.Of("shop.invoices"), id(t, 1000)) {
			t.Fatalf("%d ids: an id is not named where it was named", many)
		}
		if v.IsNamed(namespace.Of("shop.invoices"), id(t, 0)) || v.IsNamed(namespace.Of("shop.orders"), id(t, 1000)) {
			t.Fatalf("%d ids: an id named in one namespace is named in the other", many)
		}
		// Named after the first question, in a namespace named before.
		v.NameOne(namespace.Of("shop.orders"), id(t, 2000))
		v.Name(namespace.Of("shop.invoices"), []docid.ID{id(t, 0)})
		if !v.IsNamed(namespace.Of("shop.orders"), id(t, 2000)) || !v.IsNamed(namespace.Of("shop.invoices"), id(t, 0)) {
			t.Fatalf("%d ids: ids named after a question are not found", many)
		}
		if v.IsNamed(namespace.Of("shop.invoices"), id(t, 2000)) || v.IsNamed(namespace.Of("shop.notes"), id(t, 0)) {
			t.Fatalf("%d ids: ids named later are named in another namespace", many)
		}
	}
}
