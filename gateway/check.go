package gateway

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/policy"
)

// CheckResult is one step of Check.
type CheckResult struct {
	Name   string
	Err    error
	Detail string
	// Warnings are findings that do not fail the check by themselves:
	// the policy's rules that match no existing namespace (lockgate
	// -check -strict fails on them).
	Warnings []string
}

// Check verifies what Start needs without starting anything: the files
// the configuration names (TLS, admin token, owner secret) and that the
// upstream and the lock store answer, the latter with its collection
// readable by lockgate's credentials. cfg must be valid. Each step is
// bounded by the upstream's dialTimeout (at least 2 s). Check does not
// bind the listeners: an init container runs before the proxy does, in
// the same network namespace, so a bind test there proves nothing.
func Check(ctx context.Context, cfg *config.Config) []CheckResult {
	var out []CheckResult
	add := func(name, detail string, err error) {
		out = append(out, CheckResult{Name: name, Err: err, Detail: detail})
	}

	_, err := ServerTLS(cfg.TLS)
	add("tls", map[bool]string{true: "client TLS configured", false: "plain TCP (tls.certFile empty)"}[cfg.TLS.Enabled()], err)
	tok, err := adminToken(cfg.AdminAuth)
	add("adminAuth", map[bool]string{true: "operator actions enabled", false: "operator actions disabled (no token file)"}[tok != ""], err)
	sec, err := readOwnerSecret(cfg.Lockstore)
	add("ownerSecret", map[bool]string{true: "owner secret read", false: "no owner secret: a random one per process"}[sec != nil], err)
	if cfg.Audit.Enabled {
		detail := "trail in " + cfg.Audit.Dir
		if cfg.Audit.Dir == "" {
			detail = "checkpoint key read (no file sink)"
		}
		add("audit", detail, checkAudit(cfg.Audit))
	}
	if ac := cfg.Audit.Collection; cfg.Audit.Enabled && ac.Name != "" {
		ns := ac.DB(cfg.Lockstore) + "." + ac.Name
		uri := auditURI(cfg)
		add("audit.collection", ns+" on "+redactURI(uri)+": test document written and deleted", ping(ctx, uri, max(cfg.Upstream.DialTimeout.D(), 2*time.Second), func(ctx context.Context, c *mongo.Client) error {
			err := c.Database(ac.DB(cfg.Lockstore)).Collection(ac.Name).FindOne(ctx, bson.D{}).Err()
			if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
				return fmt.Errorf("reading %s: %w", ns, err)
			}
			return probeAuditCollection(ctx, c.Database(ac.DB(cfg.Lockstore)), ac.Name)
		}))
	}

	timeout := max(cfg.Upstream.DialTimeout.D(), 2*time.Second)
	add("upstream", redactURI(cfg.Upstream.URI), ping(ctx, cfg.Upstream.URI, timeout, nil))
	lockURI := cfg.Lockstore.URI
	if lockURI == "" {
		lockURI = cfg.Upstream.URI
	}
	ns := cfg.Lockstore.Database + "." + cfg.Lockstore.Collection
	add("lockstore", ns+" on "+redactURI(lockURI), ping(ctx, lockURI, timeout, func(ctx context.Context, c *mongo.Client) error {
		err := c.Database(cfg.Lockstore.Database).Collection(cfg.Lockstore.Collection).FindOne(ctx, bson.D{}).Err()
		if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
			return fmt.Errorf("reading %s: %w", ns, err)
		}
		return nil
	}))

	pol, err := policy.CompileWithLease(cfg.Policy, cfg.Lockstore.DefaultLeaseMS)
	if err == nil {
		err = ping(ctx, cfg.Upstream.URI, timeout, func(ctx context.Context, c *mongo.Client) error {
			w, err := policyWarnings(ctx, c, pol)
			out = append(out, CheckResult{Name: "policy", Detail: fmt.Sprintf("%d rules, %d warnings", len(cfg.Policy.Namespaces), len(w)), Warnings: w, Err: err})
			return nil
		})
	}
	if err != nil {
		add("policy", "rules checked against the upstream's namespaces", err)
	}
	return out
}

var uriPassword = regexp.MustCompile(`^([a-z+]+://[^:@/]*):[^@/]*@`)

// redactURI hides a connection string's password: -check output ends up in
// init container logs.
func redactURI(uri string) string { return uriPassword.ReplaceAllString(uri, "$1:xxxxx@") }

// ping connects to uri, runs ping and then more, and disconnects.
func ping(ctx context.Context, uri string, timeout time.Duration, more func(context.Context, *mongo.Client) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := mongo.Connect(ctx, options.Client().ApplyURI(uri).SetAppName("lockgate-check").SetServerSelectionTimeout(timeout))
	if err != nil {
		return err
	}
	defer c.Disconnect(context.WithoutCancel(ctx))
	if err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "ping", Value: 1}}).Err(); err != nil {
		return err
	}
	if more != nil {
		return more(ctx, c)
	}
	return nil
}
