// Package cachepb holds the generated wire types of the cache advisor plugin
// protocol (advisor.proto). It is internal: only the shim in sdk/cache
// converts between these types and the Go contract.
package cachepb

// Regenerate with `go generate ./sdk/cache/internal/cachepb` (needs protoc,
// protoc-gen-go and protoc-gen-go-grpc on PATH; see docs/plugins.md).
//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative advisor.proto
