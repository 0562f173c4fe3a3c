package wire

// internName returns b as a string, without allocating for the command
// and database names that make up nearly all traffic. The switch compiles
// to comparisons against constants, so there is no table to keep.
func internName(b []byte) string {
	switch string(b) {
	case "find":
		return "find"
	case "getMore":
		return "getMore"
	case "killCursors":
		return "killCursors"
	case "insert":
		return "insert"
	case "update":
		return "update"
	case "delete":
		return "delete"
	case "findAndModify":
		return "findAndModify"
	case "findandmodify":
		return "findandmodify"
	case "aggregate":
		return "aggregate"
	case "count":
		return "count"
	case "distinct":
		return "distinct"
	case "bulkWrite":
		return "bulkWrite"
	case "hello":
		return "hello"
	case "isMaster":
		return "isMaster"
	case "ismaster":
		return "ismaster"
	case "ping":
		return "ping"
	case "buildInfo":
		return "buildInfo"
	case "buildinfo":
		return "buildinfo"
	case "endSessions":
		return "endSessions"
	case "saslStart":
		return "saslStart"
	case "saslContinue":
		return "saslContinue"
	case "listCollections":
		return "listCollections"
	case "listDatabases":
		return "listDatabases"
	case "listIndexes":
		return "listIndexes"
	case "createIndexes":
		return "createIndexes"
	case "create":
		return "create"
	case "drop":
		return "drop"
	case "dropDatabase":
		return "dropDatabase"
	case "commitTransaction":
		return "commitTransaction"
	case "abortTransaction":
		return "abortTransaction"
	case "documents":
		return "documents"
	case "updates":
		return "updates"
	case "deletes":
		return "deletes"
	case "ops":
		return "ops"
	case "nsInfo":
		return "nsInfo"
	case "admin":
		return "admin"
	case "config":
		return "config"
	case "local":
		return "local"
	case "test":
		return "test"
	}
	return string(b)
}
