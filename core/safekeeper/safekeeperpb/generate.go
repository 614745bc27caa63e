// Package safekeeperpb holds the generated gRPC code of the safekeeper API.
// Wire types stay here and in core/safekeeper/server; nothing else imports
// them.
package safekeeperpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative safekeeper.proto
