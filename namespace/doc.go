// Package namespace is a MongoDB namespace, a database and a collection in
// it, with the one way lockgate reads "db.coll": split at the first dot, as
// the server does, so that system collections with dots in their names
// (system.indexes, system.buckets.x) and "db.$cmd" keep them in the
// collection.
//
// It is a leaf: the codec (wire), the id package (docid), the policy and
// the configuration all speak of namespaces, and none of them should have
// to import another to do so. It must never import anything of lockgate.
package namespace
