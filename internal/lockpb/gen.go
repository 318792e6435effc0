// Package lockpb holds the generated protobuf and gRPC code of quorumlock's
// wire protocol. The generated files are committed; CI has no protoc.
package lockpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative lock.proto
