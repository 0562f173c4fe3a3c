package gateway

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
)

// policyWarnings lists the rules of pol that match no namespace that
// exists now: a misspelt rule ("shop.ordres") or one that differs from the
// real name only by case ("Shop.Orders"; MongoDB names are case-sensitive)
// protects nothing, silently. A collection that does not exist yet is
// legitimate (it may be created later), so these are warnings, logged at
// start and reload and shown in /policy, never refusals.
func policyWarnings(ctx context.Context, client *mongo.Client, pol *policy.Policy) ([]string, error) {
	dbs, err := client.ListDatabaseNames(ctx, bson.D{})
	if err != nil {
		return nil, fmt.Errorf("listing databases: %w", err)
	}
	colls := map[string][]string{}
	var warnings []string
	rules, _ := pol.Rules()
	for _, r := range rules {
		db, coll := namespace.Of(r.Match).Parts()
		if !contains(dbs, db) {
			if other, ok := foldMatch(dbs, db); ok {
				warnings = append(warnings, fmt.Sprintf("rule %q: database %q does not exist, %q does: names differ only by case, and MongoDB's are case-sensitive, so this rule protects nothing there", r.Match, db, other))
			} else {
				warnings = append(warnings, fmt.Sprintf("rule %q matches no existing namespace: database %q does not exist (yet)%s", r.Match, db, didYouMean(dbs, db, "")))
			}
			continue
		}
		if coll == "*" {
			continue
		}
		names, ok := colls[db]
		if !ok {
			if names, err = client.Database(db).ListCollectionNames(ctx, bson.D{}); err != nil {
				return warnings, fmt.Errorf("listing the collections of %s: %w", db, err)
			}
			colls[db] = names
		}
		if contains(names, coll) {
			continue
		}
		if other, ok := foldMatch(names, coll); ok {
			warnings = append(warnings, fmt.Sprintf("rule %q: collection %s.%s does not exist, %s.%s does: names differ only by case, and MongoDB's are case-sensitive, so this rule protects nothing there", r.Match, db, coll, db, other))
		} else {
			warnings = append(warnings, fmt.Sprintf("rule %q matches no existing namespace: collection %s.%s does not exist (yet)%s", r.Match, db, coll, didYouMean(names, coll, db+".")))
		}
	}
	return warnings, nil
}

func contains(names []string, n string) bool {
	for _, x := range names {
		if x == n {
			return true
		}
	}
	return false
}

func foldMatch(names []string, n string) (string, bool) {
	for _, x := range names {
		if strings.EqualFold(x, n) {
			return x, true
		}
	}
	return "", false
}

// didYouMean names the existing names closest to n (at most two edits
// away, and fewer than half its length, so that short names do not
// suggest unrelated ones), as "; did you mean ...?", or "" when none is.
// prefix is put before each suggestion (the database of a collection).
func didYouMean(names []string, n, prefix string) string {
	best, bestD := []string(nil), 3
	for _, x := range names {
		d := editDistance(x, n)
		if d == 0 || 2*d >= len([]rune(n)) || d > bestD {
			continue
		}
		if d < bestD {
			best, bestD = best[:0], d
		}
		best = append(best, strconv.Quote(prefix+x))
	}
	if len(best) == 0 {
		return ""
	}
	return "; did you mean " + strings.Join(best, " or ") + "?"
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and transpositions of adjacent
// runes (the usual typo, "ordres" for "orders") each cost one.
func editDistance(a, b string) int {
	x, y := []rune(a), []rune(b)
	prev2 := make([]int, len(y)+1)
	prev := make([]int, len(y)+1)
	cur := make([]int, len(y)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(x); i++ {
		cur[0] = i
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && x[i-1] == y[j-2] && x[i-2] == y[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(y)]
}

// checkPolicy computes and publishes the policy's warnings, logging each.
func (g *Gateway) checkPolicy(ctx context.Context, pol *policy.Policy) {
	warnings, err := policyWarnings(ctx, g.nsClient, pol)
	if err != nil {
		g.logger.Info("could not check the policy's rules against the existing namespaces", zap.Error(err))
	}
	for _, w := range warnings {
		g.logger.Warn("policy rule matches no existing namespace: fine if it is created later, a mistake otherwise", zap.String("warning", w), zap.String("policyVersion", pol.Version()))
	}
	g.policyWarnings.Store(&warnings)
}

// PolicyWarnings returns the warnings about the policy in force, checked
// again against the namespaces that exist now, so that a rule flagged at
// start because its collection did not exist yet stops being flagged once
// it does. When that check fails, the warnings of the last logged check
// (start or reload) are returned.
func (g *Gateway) PolicyWarnings() []string {
	if pol := g.guard.Policy(); pol != nil && g.nsClient != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if w, err := policyWarnings(ctx, g.nsClient, pol); err == nil {
			return w
		}
	}
	if w := g.policyWarnings.Load(); w != nil {
		return *w
	}
	return nil
}
