package audittrail

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// Filter selects records of Query; empty fields match anything. With
// ID, a record matches when one of its ids is ID as lockgate formats it
// (42, "abc" quoted, ObjectId("...")) or ID is the string or ObjectId
// hex unquoted.
type Filter struct {
	NS     string
	ID     string
	Holder string
	User   string
	App    string
}

func (f *Filter) match(r *Record) bool {
	if r.Kind != KindDecision && r.Kind != KindLock {
		return false
	}
	if (f.NS != "" && r.NS != f.NS) || (f.Holder != "" && r.Holder != f.Holder) ||
		(f.User != "" && r.User != f.User) || (f.App != "" && r.App != f.App) {
		return false
	}
	if f.ID == "" {
		return true
	}
	q, oid := strconv.Quote(f.ID), `ObjectId("`+f.ID+`")`
	return slices.ContainsFunc(r.IDs, func(id string) bool { return id == f.ID || id == q || id == oid })
}

// Query calls fn, in trail order, with every decision and lock record of
// dir that f matches. It reads; it does not verify (Verify does): a line
// that is not a record is an error naming it.
func Query(dir string, f Filter, fn func(*Record) error) error {
	return Read(dir, func(r *Record) error {
		if f.match(r) {
			return fn(r)
		}
		return nil
	})
}

// Read calls fn with every record of dir, in trail order, without
// verifying them.
func Read(dir string, fn func(*Record) error) error {
	names, err := segments(dir)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := readSegment(filepath.Join(dir, name), name, fn); err != nil {
			return err
		}
	}
	return nil
}

func readSegment(path, name string, fn func(*Record) error) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for n := 1; sc.Scan(); n++ {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			if !hasMore(sc) {
				return nil // a torn last line (a crash)
			}
			return fmt.Errorf("%s line %d: not a record: %w (run verify)", name, n, err)
		}
		if err := fn(&r); err != nil {
			return err
		}
	}
	return sc.Err()
}

// hasMore reports whether the scanner has another line, consuming it
// (only called on the way out).
func hasMore(sc *bufio.Scanner) bool { return sc.Scan() }
