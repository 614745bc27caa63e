// Package objectstorepb holds the generated wire types of the object store
// plugin protocol (objectstore.proto). It is internal: only the shim in
// sdk/objectstore converts between these types and the Go contract.
package objectstorepb

// Regenerate with `go generate ./sdk/internal/objectstorepb` (needs protoc,
// protoc-gen-go and protoc-gen-go-grpc on PATH; see docs/plugins.md).
//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative objectstore.proto
