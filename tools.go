//go:build tools

// Package lockgate pins the module's dependencies while the packages that
// use them are being written, so that `go mod tidy` keeps them. Remove once
// every dependency is imported by real code.
package lockgate

import (
	_ "github.com/hashicorp/golang-lru/v2"
	_ "github.com/klauspost/compress/snappy"
	_ "github.com/klauspost/compress/zlib"
	_ "github.com/klauspost/compress/zstd"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "go.mongodb.org/mongo-driver/mongo"
	_ "go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	_ "go.uber.org/goleak"
	_ "go.uber.org/zap"
	_ "gopkg.in/yaml.v3"
)
