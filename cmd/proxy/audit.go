package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/lockgate/lockgate/audittrail"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/mongo"
	mongooptions "go.mongodb.org/mongo-driver/mongo/options"
)

// runAudit is `lockgate audit verify|query ...`: offline tools over a
// trail directory; they never start the gateway. Exit codes: 0 the trail
// verified (verify) or the query ran, 1 it did not verify or could not be
// read, 2 bad usage.
func runAudit(args []string, stdout, stderr io.Writer) int {
	usage := func() {
		fmt.Fprint(stderr, "Usage:\n"+
			"  lockgate audit verify -key FILE [-key OLDFILE ...] [-head SHIPPED-HEAD ...] [-pruned] DIR\n"+
			"  lockgate audit verify -pubkey ED25519-PUBLIC.pem [-pubkey OLD.pem ...] [-key OLDFILE ...] DIR\n"+
			"  lockgate audit verify -key FILE ... -uri MONGODB-URI -collection DB.COLL [-instance NAME]\n"+
			"  lockgate audit verify -unsigned DIR\n"+
			"  lockgate audit query [-ns DB.COLL] [-id ID] [-holder TAG] [-user USER] [-app APP] DIR\n"+
			"  lockgate audit query ... -uri MONGODB-URI -collection DB.COLL [-instance NAME]\n")
	}
	if len(args) == 0 {
		usage()
		return exitUsage
	}
	switch args[0] {
	case "verify":
		return auditVerify(args[1:], stdout, stderr)
	case "query":
		return auditQuery(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		usage()
		return exitOK
	}
	fmt.Fprintf(stderr, "lockgate audit: unknown command %q\n", args[0])
	usage()
	return exitUsage
}

// keyFiles is a repeatable -key flag.
type keyFiles []string

func (k *keyFiles) String() string     { return strings.Join(*k, ",") }
func (k *keyFiles) Set(v string) error { *k = append(*k, v); return nil }

// source is where a subcommand reads the trail: a directory (the one
// argument) or a collection (-uri and -collection).
type source struct {
	uri, collection, instance string
	dir                       string
}

func (src *source) flags(fs *flag.FlagSet) {
	fs.StringVar(&src.uri, "uri", "", "MongoDB connection `string` of the trail collection's deployment (with -collection, instead of DIR)")
	fs.StringVar(&src.collection, "collection", "", "the trail collection, `db.coll` (audit.collection)")
	fs.StringVar(&src.instance, "instance", "", "only this lockgate instance's records (a collection may hold several); default: every instance")
}

// parse takes the directory argument, or checks the collection flags.
func (src *source) parse(fs *flag.FlagSet, stderr io.Writer) bool {
	name := fs.Name()
	if src.uri == "" && src.collection == "" {
		if src.instance != "" {
			fmt.Fprintln(stderr, name+": -instance applies to a collection (-uri, -collection)")
			return false
		}
		if fs.NArg() != 1 {
			fmt.Fprintln(stderr, name+": one trail directory expected (or -uri and -collection)")
			return false
		}
		src.dir = fs.Arg(0)
		return true
	}
	_, ok := namespace.Parse(src.collection)
	switch {
	case src.uri == "" || src.collection == "":
		fmt.Fprintln(stderr, name+": -uri and -collection go together")
		return false
	case !ok:
		fmt.Fprintf(stderr, "%s: -collection %q: want db.coll\n", name, src.collection)
		return false
	case fs.NArg() != 0:
		fmt.Fprintln(stderr, name+": a directory and a collection: name one")
		return false
	}
	return true
}

// open connects to the collection.
func (src *source) open(ctx context.Context) (*mongo.Collection, func(), error) {
	c, err := mongo.Connect(ctx, mongooptions.Client().ApplyURI(src.uri).SetAppName("lockgate-audit").SetServerSelectionTimeout(10*time.Second))
	if err != nil {
		return nil, nil, err
	}
	db, coll := namespace.Of(src.collection).Parts()
	return c.Database(db).Collection(coll), func() { c.Disconnect(context.WithoutCancel(ctx)) }, nil
}

// instances are the instances to read: -instance, or every one found.
func (src *source) instances(ctx context.Context, coll *mongo.Collection) ([]string, error) {
	if src.instance != "" {
		return []string{src.instance}, nil
	}
	inst, err := audittrail.Instances(ctx, coll)
	if err == nil && len(inst) == 0 {
		err = fmt.Errorf("no records in %s", src.collection)
	}
	return inst, err
}

func auditVerify(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lockgate audit verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var files keyFiles
	fs.Var(&files, "key", "checkpoint key `file` (audit.keyFile: an HMAC secret or an Ed25519 private key); repeat it for keys rotated out")
	var pubFiles keyFiles
	fs.Var(&pubFiles, "pubkey", "Ed25519 public key `file` (PEM) of checkpoints signed with Ed25519: enough to verify, useless to a forger. Repeatable")
	unsigned := fs.Bool("unsigned", false, "check the chain only, not the checkpoint signatures (no key at hand)")
	pruned := fs.Bool("pruned", false, "the oldest segments (records) were removed by retention: verify from the first one present")
	var heads keyFiles
	fs.Var(&heads, "head", "a copy of head.json (or of a head document, as JSON) kept elsewhere (`file`); the trail must reach it too. Repeatable")
	var src source
	src.flags(fs)
	if err := fs.Parse(args); err != nil {
		return usageCode(err)
	}
	if !src.parse(fs, stderr) {
		return exitUsage
	}
	if len(files) == 0 && len(pubFiles) == 0 && !*unsigned {
		fmt.Fprintln(stderr, "lockgate audit verify: -key FILE or -pubkey FILE is needed to check signatures (or -unsigned to check the chain only)")
		return exitUsage
	}
	var keys []audittrail.Key
	for _, f := range files {
		k, err := audittrail.KeyFromFile(f)
		if err != nil {
			fmt.Fprintln(stderr, "lockgate audit verify: -key:", err)
			return exitUsage
		}
		keys = append(keys, k)
	}
	for _, f := range pubFiles {
		k, err := audittrail.KeyFromFile(f)
		if err == nil && (k.Public == nil || k.Private != nil) {
			err = errors.New(f + ": not an Ed25519 public key (PEM PUBLIC KEY; openssl pkey -in KEY -pubout)")
		}
		if err != nil {
			fmt.Fprintln(stderr, "lockgate audit verify: -pubkey:", err)
			return exitUsage
		}
		keys = append(keys, k)
	}
	opts := audittrail.VerifyOptions{Keys: keys, Pruned: *pruned, Heads: heads}
	if src.dir != "" {
		rep, err := audittrail.VerifyWith(src.dir, opts)
		if err != nil {
			fmt.Fprintln(stdout, "FAIL", err)
			return exitFailure
		}
		return report(rep, stdout, stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	coll, disconnect, err := src.open(ctx)
	if err != nil {
		fmt.Fprintln(stdout, "FAIL", err)
		return exitFailure
	}
	defer disconnect()
	inst, err := src.instances(ctx, coll)
	if err != nil {
		fmt.Fprintln(stdout, "FAIL", err)
		return exitFailure
	}
	code := exitOK
	// One verdict line per instance: each is a chain of its own.
	for _, in := range inst {
		rep, err := audittrail.VerifyCollection(ctx, coll, in, opts)
		if err != nil {
			fmt.Fprintf(stdout, "FAIL %s (instance %s): %v\n", src.collection, in, err)
			code = exitFailure
			continue
		}
		if c := report(rep, stdout, stderr); c != exitOK {
			code = c
		}
	}
	return code
}

// report prints a verification's notes and verdict.
func report(rep *audittrail.Report, stdout, stderr io.Writer) int {
	for _, n := range rep.Notes {
		fmt.Fprintln(stderr, "note:", n)
	}
	fmt.Fprintln(stdout, rep.Verdict())
	if !rep.OK() {
		return exitFailure
	}
	return exitOK
}

func auditQuery(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lockgate audit query", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f audittrail.Filter
	fs.StringVar(&f.NS, "ns", "", "namespace `db.coll`")
	fs.StringVar(&f.ID, "id", "", "document `_id` as lockgate prints it (42, abc or \"abc\", an ObjectId's hex)")
	fs.StringVar(&f.Holder, "holder", "", "lock holder `tag` (as the lock view GET /locks prints it)")
	fs.StringVar(&f.User, "user", "", "authenticated `user` (user@db)")
	fs.StringVar(&f.App, "app", "", "application `name`")
	var src source
	src.flags(fs)
	if err := fs.Parse(args); err != nil {
		return usageCode(err)
	}
	if !src.parse(fs, stderr) {
		return exitUsage
	}
	if f == (audittrail.Filter{}) {
		fmt.Fprintln(stderr, "lockgate audit query: name at least one of -ns, -id, -holder, -user, -app")
		return exitUsage
	}
	fmt.Fprintln(stdout, "TIME\tSEQ\tKIND\tNS\tIDS\tOP\tVERDICT\tREASON\tAPP\tUSER\tCLIENT\tHOLDER\tTOKENS")
	print := func(r *audittrail.Record) error {
		_, err := fmt.Fprintf(stdout, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			r.Time, r.Seq, r.Kind, r.NS, strings.Join(r.IDs, ","), r.Op, r.Verdict, dash(r.Reason),
			dash(r.App), dash(r.User), dash(r.Client), dash(r.Holder), tokens(r.Tokens))
		return err
	}
	var err error
	if src.dir != "" {
		err = audittrail.Query(src.dir, f, print)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		var coll *mongo.Collection
		var disconnect func()
		if coll, disconnect, err = src.open(ctx); err == nil {
			defer disconnect()
			// Records of every instance, in (instance, seq) order, unless
			// -instance names one.
			err = audittrail.QueryCollection(ctx, coll, src.instance, f, print)
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "lockgate audit query:", err)
		return exitFailure
	}
	return exitOK
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func tokens(ts []int64) string {
	if len(ts) == 0 {
		return "-"
	}
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = fmt.Sprint(t)
	}
	return strings.Join(s, ",")
}

func usageCode(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	return exitUsage
}
