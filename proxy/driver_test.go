package proxy

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/event"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/description"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// TestDriverNeverSeesTheMembers: a real driver pointed at the proxy, in
// front of a replica set primary, sees one mongos-like server, the proxy,
// and never learns another address to connect to.
func TestDriverNeverSeesTheMembers(t *testing.T) {
	rs := startReplicaSet(t)
	p := startProxy(t, Options{Upstream: dialTo(rs.members[0].Addr())})

	var mu sync.Mutex
	seen := map[string]description.ServerKind{}
	monitor := &event.ServerMonitor{
		TopologyDescriptionChanged: func(e *event.TopologyDescriptionChangedEvent) {
			mu.Lock()
			defer mu.Unlock()
			for _, s := range e.NewDescription.Servers {
				seen[s.Addr.String()] = s.Kind
			}
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := mongo.Connect(ctx, options.Client().ApplyURI("mongodb://"+p.addr+"/").SetServerMonitor(monitor))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Disconnect(context.Background())
	var reply bson.M
	if err := client.Database("admin").RunCommand(ctx, bson.D{{"ping", 1}}).Decode(&reply); err != nil {
		t.Fatalf("ping through the proxy: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Fatalf("driver saw servers %v, want only the proxy %s", seen, p.addr)
	}
	if kind, ok := seen[p.addr]; !ok || kind != description.Mongos {
		t.Fatalf("driver saw %v, want %s as a mongos", seen, p.addr)
	}
}
