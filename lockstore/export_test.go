package lockstore

// EmbeddedURI is the embedded FerretDB of the package's tests, for the
// contract tests of package lockstore_test.
func EmbeddedURI() string { return upstreamURI }
