package lockgate_test

import (
	"context"
	"errors"
	"log"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"

	"github.com/lockgate/lockgate/client/lockgate"
)

// Lock order 42, mark it paid with the fencing token, always release.
func ExampleWithLock() {
	ctx := context.Background()
	client, err := mongo.Connect(ctx, lockgate.ClientOptions("mongodb://127.0.0.1:27018/", "billing"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Disconnect(ctx)
	sess, err := client.StartSession()
	if err != nil {
		log.Fatal(err)
	}
	defer sess.EndSession(ctx)
	orders := client.Database("shop").Collection("orders")
	err = lockgate.WithLock(ctx, sess, orders, []any{42}, &lockgate.Options{Lease: 10 * time.Second},
		func(ctx mongo.SessionContext, l *lockgate.Lock) error {
			_, err := orders.UpdateOne(ctx, bson.M{"_id": 42}, bson.M{"$set": bson.M{"paid": true, "fence": l.Token()}})
			return err
		})
	switch {
	case errors.Is(err, lockgate.ErrBusy), errors.Is(err, lockgate.ErrTimeout):
		log.Print("someone else is working on order 42; try later")
	case err != nil:
		log.Fatal(err)
	}
}

// Hold a lock across long work, stopping when it is lost.
func ExampleAcquire() {
	ctx := context.Background()
	var sess mongo.Session     // client.StartSession()
	var jobs *mongo.Collection // the protected collection
	var steps []func(context.Context) error
	l, err := lockgate.Acquire(ctx, sess, jobs, []any{"nightly-report"}, &lockgate.Options{Lease: 30 * time.Second, Wait: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	var workErr error
	for _, step := range steps {
		if workErr = step(mongo.NewSessionContext(l.Context(), sess)); workErr != nil {
			break
		}
	}
	errText := ""
	if workErr != nil {
		errText = workErr.Error() // the next holder sees it as lastError
	}
	if err := l.Release(ctx, errText); err != nil {
		log.Print(err)
	}
	if l.Err() != nil {
		log.Print("the lock was lost during the work: ", l.Err())
	}
}
