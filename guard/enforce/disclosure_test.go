package enforce

import (
	"testing"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/policy"
	"go.mongodb.org/mongo-driver/bson"
)

// TestRefusalNamesOnlyWhatItsNamespaceNamed: an id a request names is
// named in its namespace only. A bulkWrite that names _id 5 in
// shop.invoices and deletes {k: 2} in shop.orders must not be refused
// showing _id 5 of shop.orders, a document the proxy found by resolving
// the filter, nor, to a caller who may read shop.orders, its holder
// (docs/SECURITY.md: documents found by resolving a filter are counted,
// never named). It failed while Verdict.Named was one list for all the
// request's namespaces.
func TestRefusalNamesOnlyWhatItsNamespaceNamed(t *testing.T) {
	locks := map[string]map[int]int{}
	for _, ns := range formNamespaces {
		locks[ns] = map[int]int{1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 1}
	}
	locks[nsInvoices][5] = 1
	c := formCase{cmd: cmdBulkWrite, ordered: true, modes: map[string]policy.Mode{nsOrders: policy.Enforce, nsInvoices: policy.Enforce, nsNotes: policy.Off},
		locks: locks, disclose: true, stmts: []formStmt{
			{ns: nsInvoices, op: opModify, filter: byID, ids: []int{5}},
			{ns: nsOrders, op: opDelete, filter: byMatch, match: 2, multi: true},
		}}
	dec, seen, _ := decideCase(t, c)
	if seen.enforced == nil || seen.enforced.Write.NS.String() != nsOrders {
		t.Fatalf("%s\nrefused with %+v, want the delete in %s refused", c, seen.enforced, nsOrders)
	}
	if ids, ok := dec.Reply.Lookup("lockgate", "ids").ArrayOK(); ok {
		vals, _ := ids.Values()
		for _, v := range vals {
			x, err := docid.New(bson.RawValue{Type: v.Type, Value: v.Data})
			if err != nil {
				t.Fatal(err)
			}
			t.Errorf("the refusal of the delete in %s shows _id %v, which its filter matched and the request named only in %s (reason %s, holder %+v)",
				nsOrders, x, nsInvoices, seen.enforced.Reason, seen.enforced.Holder)
		}
	}
}
