package embedded_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	_ "modernc.org/sqlite"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
)

// TestIDIndexServesFerretDBsIDLookups: the statement FerretDB runs for a
// lookup by _id (WHERE _ferretdb_sjson->'$._id' = ?) searches an index
// once the collection's table exists (without the server's second index
// it scans every row: FerretDB's own _id index is on another
// expression), the clients still see only the collection's own index
// and the documents they wrote, and a database dropped and made again
// (a new file) gets the index again.
func TestIDIndexServesFerretDBsIDLookups(t *testing.T) {
	dir := t.TempDir()
	srv, err := embedded.Start(embedded.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ctx := context.Background()
	c, err := mongo.Connect(ctx, options.Client().ApplyURI(srv.URI()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Disconnect(ctx) })
	coll := c.Database("idx").Collection("docs")

	for round := 1; round <= 2; round++ {
		for i := range 50 {
			if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: fmt.Sprintf("k%02d", i)}, {Key: "round", Value: round}}); err != nil {
				t.Fatal(err)
			}
		}
		db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "idx.sqlite")+"?mode=ro&_pragma=busy_timeout(10000)")
		if err != nil {
			t.Fatal(err)
		}
		var plan string
		testkit.Eventually(t, 10*time.Second, "the _id lookup of idx.docs searches an index", func() bool {
			plan = idPlan(t, db)
			return strings.Contains(plan, "USING INDEX") && strings.Contains(plan, "_lockgate_id")
		})
		db.Close()
		t.Logf("round %d: %s", round, plan)

		var got bson.M
		if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "k07"}}).Decode(&got); err != nil || got["round"] != int32(round) {
			t.Fatalf("round %d: find k07: %v, %v", round, got, err)
		}
		specs, err := coll.Indexes().ListSpecifications(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(specs) != 1 || specs[0].Name != "_id_" {
			t.Fatalf("round %d: listIndexes shows %v, want only _id_", round, specs)
		}
		if round == 1 {
			if err := c.Database("idx").Drop(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// idPlan is SQLite's plan for FerretDB's lookup by _id in the table of
// idx.docs, "" while there is no such table.
func idPlan(t *testing.T, db *sql.DB) string {
	t.Helper()
	var table string
	err := db.QueryRow(`SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE '\_ferretdb\_%' ESCAPE '\' AND sql LIKE '%_ferretdb_sjson%'`).Scan(&table)
	if err != nil {
		return ""
	}
	rows, err := db.Query(fmt.Sprintf(`EXPLAIN QUERY PLAN SELECT _ferretdb_sjson FROM %q WHERE _ferretdb_sjson->'$._id' = ?`, table), `"k07"`)
	if err != nil {
		return ""
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	return strings.Join(plan, "; ")
}
