#!/usr/bin/python3
"""An unchanged legacy writer: $inc in a loop, no sessions, no lock calls.

Usage: /usr/bin/python3 legacy_writer.py <proxy-uri> <db> <coll> <rounds> <ids,...>

Prints one JSON line: {"acked": {"<id>": n}, "refused": [{"reason", "app"}],
"errors": ["..."]}. It judges nothing; tests/reliability/legacy_test.go does.
"""

import json
import sys

import pymongo
from pymongo.errors import OperationFailure, PyMongoError


def main():
    uri, db, coll, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ids = [int(x) for x in sys.argv[5].split(",")]
    c = pymongo.MongoClient(uri, appname="legacy-writer", retryWrites=False)
    col = c[db][coll]
    acked = {str(i): 0 for i in ids}
    refused, errors = [], []
    for _ in range(rounds):
        for i in ids:
            try:
                r = col.update_one({"_id": i}, {"$inc": {"n": 1}})
                if r.acknowledged and r.modified_count == 1:
                    acked[str(i)] += 1
                else:
                    errors.append("not modified: %d" % i)
            except OperationFailure as e:
                info = (e.details or {}).get("lockgate", {})
                refused.append({"reason": info.get("reason"), "app": (info.get("holder") or {}).get("app"), "code": e.code})
            except PyMongoError as e:
                errors.append(str(e))
    print(json.dumps({"acked": acked, "refused": refused, "errors": errors}))


main()
