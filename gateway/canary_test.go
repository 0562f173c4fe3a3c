package gateway

import (
	"context"
	"errors"
	"testing"

	"github.com/lockgate/lockgate/config"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap/zaptest"
)

// TestCanaryAuditToEnforce moves one collection from audit to enforce with
// a reload while a client stays connected: the same client, over the same
// connections, is let through before and refused after, and no connection
// is dropped.
func TestCanaryAuditToEnforce(t *testing.T) {
	up := startEmbedded(t)
	cfg := testConfig()
	cfg.Upstream.URI = up.URI()
	cfg.Policy.Namespaces = []config.NamespaceRule{{Match: "shop.canary", Mode: config.ModeAudit}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gw, err := Start(ctx, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	client, err := mongo.Connect(ctx, options.Client().ApplyURI("mongodb://"+gw.ProxyAddr().String()+"/").SetMaxPoolSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Disconnect(context.Background())
	coll := client.Database("shop").Collection("canary")
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "n", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	inc := bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, inc); err != nil {
		t.Fatalf("unlocked write under audit: %v", err)
	}
	conns := func() float64 {
		mfs, _ := gw.Registry().Gather()
		for _, mf := range mfs {
			if mf.GetName() == "lockgate_client_connections_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return -1
	}
	before := conns()

	next := *cfg
	next.Policy.Namespaces = []config.NamespaceRule{{Match: "shop.canary", Mode: config.ModeEnforce}}
	if err := gw.Reload(&next); err != nil {
		t.Fatal(err)
	}
	_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, inc)
	var se mongo.ServerError
	if !errors.As(err, &se) || !se.HasErrorCode(46) {
		t.Fatalf("unlocked write after the switch to enforce: %v", err)
	}
	var doc bson.M
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&doc); err != nil || doc["n"] != int32(1) {
		t.Fatalf("document after the refused write: %v %v", doc, err)
	}
	if after := conns(); after != before {
		t.Fatalf("client connections accepted went from %v to %v across the reload", before, after)
	}
	if got := testutil.ToFloat64(gw.reloads.WithLabelValues("applied")); got != 1 {
		t.Fatalf("applied reloads = %v", got)
	}
}
