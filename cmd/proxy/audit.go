package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/lockgate/lockgate/audittrail"
)

// runAudit is `lockgate audit verify|query ...`: offline tools over a
// trail directory; they never start the gateway. Exit codes: 0 the trail
// verified (verify) or the query ran, 1 it did not verify or could not be
// read, 2 bad usage.
func runAudit(args []string, stdout, stderr io.Writer) int {
	usage := func() {
		fmt.Fprint(stderr, "Usage:\n"+
			"  lockgate audit verify -key FILE [-key OLDFILE ...] [-head SHIPPED-HEAD ...] [-pruned] DIR\n"+
			"  lockgate audit verify -unsigned DIR\n"+
			"  lockgate audit query [-ns DB.COLL] [-id ID] [-holder TAG] [-user USER] [-app APP] DIR\n")
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

func auditVerify(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lockgate audit verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var files keyFiles
	fs.Var(&files, "key", "checkpoint key `file` (audit.keyFile); repeat it for keys rotated out")
	unsigned := fs.Bool("unsigned", false, "check the chain only, not the checkpoint signatures (no key at hand)")
	pruned := fs.Bool("pruned", false, "the oldest segments were removed by retention: verify from the first segment present")
	var heads keyFiles
	fs.Var(&heads, "head", "a copy of head.json kept elsewhere (`file`); the trail must reach it too. Repeatable")
	if err := fs.Parse(args); err != nil {
		return usageCode(err)
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "lockgate audit verify: one trail directory expected")
		return exitUsage
	}
	if len(files) == 0 && !*unsigned {
		fmt.Fprintln(stderr, "lockgate audit verify: -key FILE is needed to check signatures (or -unsigned to check the chain only)")
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
	rep, err := audittrail.VerifyWith(fs.Arg(0), audittrail.VerifyOptions{Keys: keys, Pruned: *pruned, Heads: heads})
	if err != nil {
		fmt.Fprintln(stdout, "FAIL", err)
		return exitFailure
	}
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
	if err := fs.Parse(args); err != nil {
		return usageCode(err)
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "lockgate audit query: one trail directory expected")
		return exitUsage
	}
	if f == (audittrail.Filter{}) {
		fmt.Fprintln(stderr, "lockgate audit query: name at least one of -ns, -id, -holder, -user, -app")
		return exitUsage
	}
	fmt.Fprintln(stdout, "TIME\tSEQ\tKIND\tNS\tIDS\tOP\tVERDICT\tREASON\tAPP\tUSER\tCLIENT\tHOLDER\tTOKENS")
	err := audittrail.Query(fs.Arg(0), f, func(r *audittrail.Record) error {
		_, err := fmt.Fprintf(stdout, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			r.Time, r.Seq, r.Kind, r.NS, strings.Join(r.IDs, ","), r.Op, r.Verdict, dash(r.Reason),
			dash(r.App), dash(r.User), dash(r.Client), dash(r.Holder), tokens(r.Tokens))
		return err
	})
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
