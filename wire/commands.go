package wire

import "strings"

// This file is the one list of every command lockgate knows, and what it
// knows about each. The parser attaches a command's entry to the Command
// (Command.Spec); classification, the reserved-namespace boundary, the
// lock commands, the handshake rewrite and the metric labels all read it,
// so a command added here is known to all of them at once, and a command
// missing here is unknown to all of them: on a protected namespace the
// classifier refuses an unknown command (policy.Classify) instead of
// guessing that it only reads.

// WriteForm is how a command can change documents, and so which of the
// classifier's readers applies to it (policy.Classify has exactly one per
// form; a test checks that none is missing).
type WriteForm uint8

// The write forms. WritesNothing is the zero value: the command reads, or
// administers the server, and changes no document of any collection.
const (
	WritesNothing       WriteForm = iota
	WritesInsert                  // documents: statements under Statements
	WritesUpdate                  // updates: statements under Statements
	WritesDelete                  // deletes: statements under Statements
	WritesFindAndModify           // the body is the one statement
	WritesBulk                    // bulkWrite on admin: ops, namespaces in nsInfo
	WritesAggregate               // only through $out or $merge
	WritesMapReduce               // only through its out option
	WritesApplyOps                // oplog entries, each naming its namespace
	WritesCollection              // replaces, trims or removes the named collection's documents wholesale
	WritesFullNamespace           // as WritesCollection, the first value being "db.coll"
	WritesDatabase                // every collection of $db
	WritesCreate                  // only a collection the server will empty on its own (capped, TTL)
	WritesValidate                // only with repair
	WritesRename                  // from one namespace over another, named in fields
	WritesCloneAsCapped           // into its toCollection
	WritesCollMod                 // only when it makes the server delete documents (TTL, capped shrink)
	WritesCreateIndexes           // only through a TTL index
	WritesAnything                // server-side JavaScript: any namespace
	WritesCopyDB                  // into todb
	WritesExplained               // as the command it explains would
	numWriteForms
)

// NumWriteForms is the number of write forms, for tables indexed by them.
const NumWriteForms = int(numWriteForms)

// Scope is what a command names, which decides where it may run.
type Scope uint8

// The scopes.
const (
	// ScopeServer: acts on the server, the connection or the session and
	// names no collection (serverStatus, replSetGetStatus, createUser).
	ScopeServer Scope = iota
	// ScopeNoCollection: names no collection and reveals none of a
	// collection's documents (hello, ping, authentication, listCollections,
	// dbStats): harmless on any database, the lock store's included.
	ScopeNoCollection
	// ScopeCollection: the first value is a collection of $db (or, for
	// WritesFullNamespace and dataSize, a full "db.coll").
	ScopeCollection
	// ScopeDatabase: acts on $db as a whole (dropDatabase, a db-level
	// aggregate, copydb), or on namespaces it names in fields
	// (renameCollection, bulkWrite, applyOps): policy.References walks
	// them.
	ScopeDatabase
)

// Role is what the proxy itself does with a command, beyond relaying it.
type Role uint8

// The roles.
const (
	RoleRelay          Role = iota // relayed; policy may still refuse it
	RoleHandshake                  // relayed; the reply is rewritten (proxy/hello.go)
	RoleAuth                       // relayed; the reply decides the connection's identity (proxy/auth.go)
	RoleLock                       // answered by the proxy, never relayed (guard/lockcmd)
	RoleEndSessions                // releases the sessions' locks, then relayed or answered (guard)
	RoleEndTransaction             // settles the transaction's locks (guard/txn)
)

// AuthStep is what an authentication command (RoleAuth) is to the
// conversation the proxy follows (proxy/auth.go).
type AuthStep uint8

// The authentication steps.
const (
	AuthNone     AuthStep = iota
	AuthStart             // saslStart: opens a conversation
	AuthContinue          // saslContinue: a later step of one
	AuthOnce              // authenticate: one step, ok is the verdict
	AuthLogout            // logout
)

// LockOp is what a lock command (RoleLock) does (guard/lockcmd).
type LockOp uint8

// The lock operations.
const (
	LockNone    LockOp = iota
	LockAcquire        // acquireLock
	LockRenew          // renewLock
	LockRelease        // releaseLock
	LockStatus         // lockStatus
)

// Disclosure is how a command that reveals sessions (RevealsSessions) can
// be harmless, by its own argument (guard/introspection.go).
type Disclosure uint8

// The disclosures.
const (
	// DisclosesAlways: every form shows or ends other clients' sessions.
	DisclosesAlways Disclosure = iota
	// DisclosesUnlessOwn: harmless when the sessions it names (its first
	// value) are only the caller's own (killSessions).
	DisclosesUnlessOwn
	// DisclosesLogLines: its first value names a log; "*" lists the log
	// names only, harmless, and "startupWarnings" is what shells ask on
	// every connection (getLog).
	DisclosesLogLines
)

// StatementKeys names the fields of one statement of a document write: an
// element of the statement list, or for findAndModify the body itself. An
// empty name: the statement has no such field.
type StatementKeys struct {
	Filter   string // the filter: q, query, filter
	Update   string // the update, replacement or pipeline: u, update, updateMods
	Upsert   string
	Multi    string // update's and bulkWrite's multi
	Limit    string // delete's limit (0: every match)
	Remove   string // findAndModify's remove
	Document string // an inserted document (bulkWrite's insert op)
}

// BulkOp is one kind of bulkWrite op, told apart by its first key (Kind),
// whose value is an index into the command's Namespaces list.
type BulkOp struct {
	Kind   string
	Writes WriteForm // WritesInsert, WritesUpdate or WritesDelete
	Keys   StatementKeys
}

// CommandSpec is what lockgate knows about one command name. Names match
// exactly, as the server matches them; an alias the server accepts
// (findandmodify, mapreduce, ismaster) is an entry of its own.
type CommandSpec struct {
	Name   string
	Writes WriteForm
	// Statements is the field (in the body or a kind-1 section) holding
	// the statements of an insert, update, delete or bulkWrite.
	Statements string
	// Statement names the fields of each statement (of the body, for
	// findAndModify); an insert's statements are the documents.
	Statement StatementKeys
	// Ops are bulkWrite's op kinds; Namespaces (with NamespaceKey in each
	// entry) is the list of namespaces its ops index.
	Ops          []BulkOp
	Namespaces   string
	NamespaceKey string
	// FullNamespaces are the fields whose values are full "db.coll"
	// namespaces the command writes: a rename's source, then its target.
	FullNamespaces []string
	Scope          Scope
	Role           Role
	// Auth is the step of an authentication command (RoleAuth).
	Auth AuthStep
	// Lock is what a lock command (RoleLock) does, and Args the fields of
	// its own it accepts besides the generic ones drivers attach, in the
	// order its error messages list them.
	Lock LockOp
	Args []string
	// Counted: the command has its own value of the "command" label of
	// lockgate_commands_total; every other command counts as "other".
	Counted bool
	// ExplainRuns: explaining the command can still write (an explained
	// aggregate's $out or $merge, mapReduce's out), so explain is
	// classified as the command; explaining any other command writes
	// nothing.
	ExplainRuns bool
	// RevealsSessions: the command lists other clients' sessions or ends
	// them (docs/SECURITY.md), refused while anything is enforced unless
	// policy.allowSessionIntrospection says otherwise.
	RevealsSessions bool
	// Discloses says when such a command is harmless after all.
	Discloses Disclosure
	// Aborts: the command ends its transaction without committing it
	// (RoleEndTransaction).
	Aborts bool
}

// LookupCommand returns the entry of a command name, nil when lockgate
// does not know it. The entry is the table's own: read it, never change
// it. It does not allocate for a []byte converted in the call
// (LookupCommand(string(b))).
func LookupCommand(name string) *CommandSpec { return commandIndex[name] }

// WriteCommandFolding returns the entry of a write command whose name
// equals name under case folding, nil if there is none: what an upstream
// that folds command names would run.
func WriteCommandFolding(name string) *CommandSpec {
	for i := range commandTable {
		if c := &commandTable[i]; c.Writes != WritesNothing && strings.EqualFold(c.Name, name) {
			return c
		}
	}
	return nil
}

// Op returns the bulkWrite op kind whose first key is kind, nil when the
// command has no such op.
func (s *CommandSpec) Op(kind string) *BulkOp {
	for i := range s.Ops {
		if s.Ops[i].Kind == kind {
			return &s.Ops[i]
		}
	}
	return nil
}

// Commands returns every entry, in the table's order.
func Commands() []CommandSpec { return append([]CommandSpec(nil), commandTable...) }

// Shorthands for the table below.
const (
	srv = ScopeServer
	noc = ScopeNoCollection
	col = ScopeCollection
	dbs = ScopeDatabase
)

// The statement fields of the document writes.
var (
	updateKeys        = StatementKeys{Filter: "q", Update: "u", Upsert: "upsert", Multi: "multi"}
	deleteKeys        = StatementKeys{Filter: "q", Limit: "limit"}
	findAndModifyKeys = StatementKeys{Filter: "query", Update: "update", Upsert: "upsert", Remove: "remove"}
	bulkOps           = []BulkOp{
		{Kind: "insert", Writes: WritesInsert, Keys: StatementKeys{Document: "document"}},
		{Kind: "update", Writes: WritesUpdate, Keys: StatementKeys{Filter: "filter", Update: "updateMods", Upsert: "upsert", Multi: "multi"}},
		{Kind: "delete", Writes: WritesDelete, Keys: StatementKeys{Filter: "filter", Multi: "multi"}},
	}
)

// commandTable: every command lockgate knows. Grouped for reading; the
// order means nothing.
var commandTable = []CommandSpec{
	// Document writes.
	{Name: "insert", Writes: WritesInsert, Statements: "documents", Scope: col, Counted: true},
	{Name: "update", Writes: WritesUpdate, Statements: "updates", Statement: updateKeys, Scope: col, Counted: true},
	{Name: "delete", Writes: WritesDelete, Statements: "deletes", Statement: deleteKeys, Scope: col, Counted: true},
	{Name: "findAndModify", Writes: WritesFindAndModify, Statement: findAndModifyKeys, Scope: col, Counted: true},
	{Name: "findandmodify", Writes: WritesFindAndModify, Statement: findAndModifyKeys, Scope: col, Counted: true},
	{Name: "bulkWrite", Writes: WritesBulk, Statements: "ops", Ops: bulkOps, Namespaces: "nsInfo", NamespaceKey: "ns", Scope: dbs, Counted: true},

	// Reads that can write: aggregate through $out/$merge, mapReduce
	// through out, explain as what it explains.
	{Name: "aggregate", Writes: WritesAggregate, Scope: col, Counted: true, ExplainRuns: true},
	{Name: "mapReduce", Writes: WritesMapReduce, Scope: col, Counted: true, ExplainRuns: true},
	{Name: "mapreduce", Writes: WritesMapReduce, Scope: col, ExplainRuns: true},
	{Name: "explain", Writes: WritesExplained, Scope: dbs, Counted: true},

	// Collection and database writes.
	{Name: "drop", Writes: WritesCollection, Scope: col, Counted: true},
	{Name: "convertToCapped", Writes: WritesCollection, Scope: col},
	{Name: "emptycapped", Writes: WritesCollection, Scope: col},
	{Name: "compact", Writes: WritesCollection, Scope: col},
	{Name: "reIndex", Writes: WritesCollection, Scope: col},
	{Name: "godinsert", Writes: WritesCollection, Scope: col},
	{Name: "captrunc", Writes: WritesCollection, Scope: col},
	{Name: "cloneCollection", Writes: WritesFullNamespace, Scope: col},
	{Name: "cleanupOrphaned", Writes: WritesFullNamespace, Scope: col},
	{Name: "dropDatabase", Writes: WritesDatabase, Scope: dbs, Counted: true},
	{Name: "repairDatabase", Writes: WritesDatabase, Scope: dbs},
	{Name: "clone", Writes: WritesDatabase, Scope: dbs},
	{Name: "create", Writes: WritesCreate, Scope: col, Counted: true},
	{Name: "validate", Writes: WritesValidate, Scope: col},
	{Name: "renameCollection", Writes: WritesRename, FullNamespaces: []string{"renameCollection", "to"}, Scope: dbs, Counted: true},
	{Name: "internalRenameIfOptionsAndIndexesMatch", Writes: WritesRename, FullNamespaces: []string{"from", "to"}, Scope: dbs},
	{Name: "cloneCollectionAsCapped", Writes: WritesCloneAsCapped, Scope: col},
	{Name: "collMod", Writes: WritesCollMod, Scope: col, Counted: true},
	{Name: "createIndexes", Writes: WritesCreateIndexes, Scope: col, Counted: true},
	{Name: "applyOps", Writes: WritesApplyOps, Scope: dbs, Counted: true},
	{Name: "doTxn", Writes: WritesApplyOps, Scope: dbs},
	{Name: "eval", Writes: WritesAnything, Scope: dbs},
	{Name: "$eval", Writes: WritesAnything, Scope: dbs},
	{Name: "copydb", Writes: WritesCopyDB, Scope: dbs},

	// Reads.
	{Name: "find", Scope: col, Counted: true},
	{Name: "getMore", Scope: dbs, Counted: true},
	{Name: "killCursors", Scope: col, Counted: true},
	{Name: "count", Scope: col, Counted: true},
	{Name: "distinct", Scope: col, Counted: true},
	{Name: "listIndexes", Scope: col, Counted: true},
	{Name: "collStats", Scope: col, Counted: true},
	{Name: "dataSize", Scope: col},
	{Name: "datasize", Scope: col},
	{Name: "filemd5", Scope: dbs},
	{Name: "geoNear", Scope: col},
	{Name: "geoSearch", Scope: col},
	{Name: "group", Scope: col},
	{Name: "parallelCollectionScan", Scope: col},
	{Name: "listSearchIndexes", Scope: col},
	{Name: "analyze", Scope: col},
	{Name: "text", Scope: col},
	{Name: "touch", Scope: col},
	{Name: "splitVector", Scope: srv},
	{Name: "autoSplitVector", Scope: col},
	{Name: "checkShardingIndex", Scope: srv},
	{Name: "dbCheck", Scope: col},
	{Name: "validateDBMetadata", Scope: srv},
	{Name: "dbHash", Scope: dbs},
	{Name: "dbhash", Scope: dbs},

	// Collection administration that changes no document.
	{Name: "dropIndexes", Scope: col, Counted: true},
	{Name: "deleteIndexes", Scope: col},
	{Name: "createSearchIndexes", Scope: col},
	{Name: "updateSearchIndex", Scope: col},
	{Name: "dropSearchIndex", Scope: col},
	{Name: "planCacheClear", Scope: col},
	{Name: "planCacheClearFilters", Scope: col},
	{Name: "planCacheListFilters", Scope: col},
	{Name: "planCacheSetFilter", Scope: col},
	{Name: "setIndexCommitQuorum", Scope: col},
	{Name: "shardCollection", Scope: srv},
	{Name: "reshardCollection", Scope: srv},
	{Name: "refineCollectionShardKey", Scope: srv},
	{Name: "unshardCollection", Scope: srv},
	{Name: "moveCollection", Scope: srv},
	{Name: "analyzeShardKey", Scope: srv},
	{Name: "compactStructuredEncryptionData", Scope: col},
	{Name: "cleanupStructuredEncryptionData", Scope: col},

	// Handshake, authentication and errors of the connection.
	{Name: "hello", Scope: noc, Role: RoleHandshake, Counted: true},
	{Name: "isMaster", Scope: noc, Role: RoleHandshake, Counted: true},
	{Name: "ismaster", Scope: noc, Role: RoleHandshake, Counted: true},
	{Name: "saslStart", Scope: noc, Role: RoleAuth, Auth: AuthStart, Counted: true},
	{Name: "saslContinue", Scope: noc, Role: RoleAuth, Auth: AuthContinue, Counted: true},
	{Name: "authenticate", Scope: noc, Role: RoleAuth, Auth: AuthOnce, Counted: true},
	{Name: "logout", Scope: noc, Role: RoleAuth, Auth: AuthLogout, Counted: true},
	{Name: "getnonce", Scope: noc, Counted: true},
	{Name: "ping", Scope: noc, Counted: true},
	{Name: "buildInfo", Scope: noc, Counted: true},
	{Name: "buildinfo", Scope: noc, Counted: true},
	{Name: "listCommands", Scope: noc},
	{Name: "connectionStatus", Scope: noc, Counted: true},
	{Name: "whatsmyuri", Scope: noc, Counted: true},
	{Name: "getLastError", Scope: noc, Counted: true},
	{Name: "getlasterror", Scope: noc},
	{Name: "getPrevError", Scope: srv},
	{Name: "getpreverror", Scope: srv},
	{Name: "resetError", Scope: srv},
	{Name: "reseterror", Scope: srv},
	{Name: "listCollections", Scope: noc, Counted: true},
	{Name: "dbStats", Scope: noc, Counted: true},
	{Name: "dbstats", Scope: noc},

	// Sessions and transactions.
	{Name: "endSessions", Scope: noc, Role: RoleEndSessions, Counted: true},
	{Name: "startSession", Scope: srv, Counted: true},
	{Name: "refreshSessions", Scope: srv, Counted: true},
	{Name: "refreshLogicalSessionCacheNow", Scope: srv},
	{Name: "killSessions", Scope: srv, Counted: true, RevealsSessions: true, Discloses: DisclosesUnlessOwn},
	{Name: "killAllSessions", Scope: srv, RevealsSessions: true},
	{Name: "killAllSessionsByPattern", Scope: srv, RevealsSessions: true},
	{Name: "commitTransaction", Scope: srv, Role: RoleEndTransaction, Counted: true},
	{Name: "abortTransaction", Scope: srv, Role: RoleEndTransaction, Aborts: true, Counted: true},

	// lockgate's own commands, answered by the proxy.
	{Name: "acquireLock", Scope: col, Role: RoleLock, Lock: LockAcquire, Args: []string{"ids", "leaseMS", "waitMS", "bind"}, Counted: true},
	{Name: "renewLock", Scope: col, Role: RoleLock, Lock: LockRenew, Args: []string{"ids", "leaseMS", "bind"}, Counted: true},
	{Name: "releaseLock", Scope: col, Role: RoleLock, Lock: LockRelease, Args: []string{"ids", "error", "bind"}, Counted: true},
	{Name: "lockStatus", Scope: col, Role: RoleLock, Lock: LockStatus, Args: []string{"ids", "bind"}, Counted: true},

	// Diagnostics. currentOp and getLog show other clients' sessions.
	{Name: "serverStatus", Scope: srv, Counted: true},
	{Name: "hostInfo", Scope: srv, Counted: true},
	{Name: "getCmdLineOpts", Scope: srv},
	{Name: "getParameter", Scope: srv, Counted: true},
	{Name: "getClusterParameter", Scope: srv},
	{Name: "getDefaultRWConcern", Scope: srv},
	{Name: "getLog", Scope: srv, RevealsSessions: true, Discloses: DisclosesLogLines},
	{Name: "currentOp", Scope: srv, Counted: true, RevealsSessions: true},
	{Name: "killOp", Scope: srv, Counted: true},
	{Name: "top", Scope: srv},
	{Name: "connPoolStats", Scope: srv},
	{Name: "shardConnPoolStats", Scope: srv},
	{Name: "lockInfo", Scope: srv},
	{Name: "features", Scope: srv},
	{Name: "availableQueryOptions", Scope: srv},
	{Name: "cursorInfo", Scope: srv},
	{Name: "getDiagnosticData", Scope: srv},
	{Name: "getFreeMonitoringStatus", Scope: srv},
	{Name: "listDatabases", Scope: srv, Counted: true},
	{Name: "isdbgrid", Scope: srv},
	{Name: "listShards", Scope: srv},
	{Name: "balancerStatus", Scope: srv},
	{Name: "shardingState", Scope: srv},
	{Name: "getShardMap", Scope: srv},
	{Name: "getShardVersion", Scope: srv},
	{Name: "replSetGetStatus", Scope: srv},
	{Name: "replSetGetConfig", Scope: srv},
	{Name: "usersInfo", Scope: srv},
	{Name: "rolesInfo", Scope: srv},
	{Name: "atlasVersion", Scope: srv},

	// Server administration. None changes a document of an application
	// collection; they are the operator's business, not the policy's.
	{Name: "profile", Scope: srv},
	{Name: "setParameter", Scope: srv},
	{Name: "setClusterParameter", Scope: srv},
	{Name: "setDefaultRWConcern", Scope: srv},
	{Name: "setFeatureCompatibilityVersion", Scope: srv},
	{Name: "setFreeMonitoring", Scope: srv},
	{Name: "fsync", Scope: srv},
	{Name: "fsyncUnlock", Scope: srv},
	{Name: "logRotate", Scope: srv},
	{Name: "rotateCertificates", Scope: srv},
	{Name: "logApplicationMessage", Scope: srv},
	{Name: "shutdown", Scope: srv},
	{Name: "dropConnections", Scope: srv},
	{Name: "setUserWriteBlockMode", Scope: srv},
	{Name: "invalidateUserCache", Scope: srv},
	{Name: "createUser", Scope: srv},
	{Name: "updateUser", Scope: srv},
	{Name: "dropUser", Scope: srv},
	{Name: "dropAllUsersFromDatabase", Scope: srv},
	{Name: "grantRolesToUser", Scope: srv},
	{Name: "revokeRolesFromUser", Scope: srv},
	{Name: "createRole", Scope: srv},
	{Name: "updateRole", Scope: srv},
	{Name: "dropRole", Scope: srv},
	{Name: "dropAllRolesFromDatabase", Scope: srv},
	{Name: "grantPrivilegesToRole", Scope: srv},
	{Name: "revokePrivilegesFromRole", Scope: srv},
	{Name: "grantRolesToRole", Scope: srv},
	{Name: "revokeRolesFromRole", Scope: srv},
	{Name: "replSetInitiate", Scope: srv},
	{Name: "replSetReconfig", Scope: srv},
	{Name: "replSetStepDown", Scope: srv},
	{Name: "replSetFreeze", Scope: srv},
	{Name: "replSetMaintenance", Scope: srv},
	{Name: "replSetSyncFrom", Scope: srv},
	{Name: "replSetResizeOplog", Scope: srv},
	{Name: "replSetAbortPrimaryCatchUp", Scope: srv},
	{Name: "enableSharding", Scope: srv},
	{Name: "addShard", Scope: srv},
	{Name: "removeShard", Scope: srv},
	{Name: "movePrimary", Scope: srv},
	{Name: "moveChunk", Scope: srv},
	{Name: "split", Scope: srv},
	{Name: "splitChunk", Scope: srv},
	{Name: "mergeChunks", Scope: srv},
	{Name: "balancerStart", Scope: srv},
	{Name: "balancerStop", Scope: srv},
	{Name: "flushRouterConfig", Scope: srv},
	{Name: "configureCollectionBalancing", Scope: srv},
	{Name: "clearJumboFlag", Scope: srv},
	{Name: "configureFailPoint", Scope: srv},
	{Name: "sleep", Scope: srv},
}

// commandIndex looks entries up by name; built once, never changed.
var commandIndex = func() map[string]*CommandSpec {
	m := make(map[string]*CommandSpec, len(commandTable))
	for i := range commandTable {
		s := &commandTable[i]
		if m[s.Name] != nil {
			panic("wire: command " + s.Name + " listed twice")
		}
		m[s.Name] = s
	}
	return m
}()

// otherNames are the names besides commands that nearly all traffic
// carries: the statement fields (kind-1 section identifiers) and the
// databases every deployment has.
var otherNames = func() map[string]string {
	m := map[string]string{}
	for _, s := range []string{"documents", "updates", "deletes", "ops", "nsInfo", "admin", "config", "local", "test"} {
		m[s] = s
	}
	return m
}()

// internName returns b as a string, without allocating for the command,
// field and database names that make up nearly all traffic.
func internName(b []byte) string {
	if s := commandIndex[string(b)]; s != nil {
		return s.Name
	}
	if s, ok := otherNames[string(b)]; ok {
		return s
	}
	return string(b)
}
