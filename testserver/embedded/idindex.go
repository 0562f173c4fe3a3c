package embedded

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	// FerretDB's own SQLite driver, registered as "sqlite".
	_ "modernc.org/sqlite"
)

// idIndexSuffix names the index idIndexer adds to a collection's table.
const idIndexSuffix = "_lockgate_id"

// idIndexEvery is how often idIndexer looks for new collection tables.
const idIndexEvery = 200 * time.Millisecond

// idIndexer gives every collection table in FerretDB's SQLite files an
// index on the expression FerretDB's own _id lookups filter on.
//
// FerretDB v1.24's SQLite backend answers a filter {_id: <string or
// ObjectId>} with WHERE _ferretdb_sjson->'$._id' = ?, but builds the
// collection's _id index on _ferretdb_sjson->"_id": a different
// expression, so SQLite's planner never uses that index (EXPLAIN QUERY
// PLAN: SCAN), and every lookup, update or delete by _id parses every
// row's JSON. The lock store's collections grow to hundreds of
// documents in a test package, and most of the CPU of the packages that
// run real servers went there (docs/TESTING.md, the eleventh box). With
// this second index the same statements read one row. It changes how
// fast FerretDB answers, never what: SQLite uses an index only where it
// gives the statement's own result, and this one is not unique, so no
// write can fail on it. FerretDB does not know of it: listIndexes and
// the clients see the collection's indexes as before.
//
// A table is indexed within idIndexEvery of its creation, from a
// connection of this process; FerretDB's connections wait for its short
// write lock (busy_timeout) as for each other's.
type idIndexer struct {
	dir  string
	stop context.CancelFunc
	done chan struct{}

	mu  sync.Mutex
	dbs map[string]*idIndexDB
}

// idIndexDB is the indexer's connection to one database file, and what
// it saw of the file when it last looked.
type idIndexDB struct {
	db    *sql.DB
	inode uint64
	seen  string // the file and its WAL's size and time at the last pass
}

func startIDIndexer(dir string) *idIndexer {
	ctx, cancel := context.WithCancel(context.Background())
	x := &idIndexer{dir: dir, stop: cancel, done: make(chan struct{}), dbs: map[string]*idIndexDB{}}
	go x.run(ctx)
	return x
}

func (x *idIndexer) run(ctx context.Context) {
	defer close(x.done)
	t := time.NewTicker(idIndexEvery)
	defer t.Stop()
	for {
		x.pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Close stops the indexer and closes its connections.
func (x *idIndexer) Close() {
	x.stop()
	<-x.done
	x.mu.Lock()
	defer x.mu.Unlock()
	for name, d := range x.dbs {
		d.db.Close()
		delete(x.dbs, name)
	}
}

// pass indexes the new tables of every database file that changed since
// the last pass.
func (x *idIndexer) pass(ctx context.Context) {
	files, err := filepath.Glob(filepath.Join(x.dir, "*.sqlite"))
	if err != nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	live := make(map[string]bool, len(files))
	for _, f := range files {
		live[f] = true
		// A file that fails (busy past the timeout, dropped meanwhile)
		// is looked at again on the next pass: its seen state is kept
		// only after it was indexed.
		_ = x.indexFile(ctx, f)
	}
	// A dropped database's file is gone: its connection goes too.
	for f, d := range x.dbs {
		if !live[f] {
			d.db.Close()
			delete(x.dbs, f)
		}
	}
}

func (x *idIndexer) indexFile(ctx context.Context, f string) error {
	var st syscall.Stat_t
	if err := syscall.Stat(f, &st); err != nil {
		return nil // dropped meanwhile
	}
	seen := fmt.Sprint(st.Size, st.Mtim)
	if wst, err := os.Stat(f + "-wal"); err == nil {
		seen += fmt.Sprint(wst.Size(), wst.ModTime().UnixNano())
	}
	d := x.dbs[f]
	if d != nil && d.inode != st.Ino {
		// Dropped and made again: the old connection holds the old file.
		d.db.Close()
		d = nil
	}
	if d == nil {
		db, err := sql.Open("sqlite", "file:"+f+"?_pragma=busy_timeout(10000)")
		if err != nil {
			return err
		}
		db.SetMaxOpenConns(1)
		d = &idIndexDB{db: db, inode: st.Ino}
		x.dbs[f] = d
	} else if d.seen == seen {
		return nil
	}
	tables, err := x.unindexed(ctx, d.db)
	if err != nil {
		return err
	}
	for _, t := range tables {
		q := fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %q ON %q (_ferretdb_sjson->'$._id')`, t+idIndexSuffix, t)
		if _, err := d.db.ExecContext(ctx, q); err != nil && !strings.Contains(err.Error(), "no such table") {
			return fmt.Errorf("%s: %s: %w", filepath.Base(f), q, err)
		}
	}
	d.seen = seen
	return nil
}

// unindexed lists the collection tables of db without the index: every
// table with FerretDB's document column, but FerretDB's own.
func (x *idIndexer) unindexed(ctx context.Context, db *sql.DB) ([]string, error) {
	rows, err := db.QueryContext(ctx, `
		SELECT t.name FROM sqlite_master t
		WHERE t.type = 'table' AND t.name NOT LIKE '\_ferretdb\_%' ESCAPE '\'
		AND t.sql LIKE '%_ferretdb_sjson%'
		AND NOT EXISTS (SELECT 1 FROM sqlite_master i WHERE i.type = 'index' AND i.name = t.name || ?)`, idIndexSuffix)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}
