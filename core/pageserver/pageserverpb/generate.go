// Package pageserverpb holds the generated wire types of the pageserver's
// gRPC API (pageserver.proto). Only core/pageserver/server and
// core/pageserver/client use them; everything else speaks Go types.
package pageserverpb

// Regenerate with `go generate ./core/pageserver/pageserverpb` (needs protoc,
// protoc-gen-go and protoc-gen-go-grpc on PATH).
//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative pageserver.proto
