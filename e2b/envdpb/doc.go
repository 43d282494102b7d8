// Package envdpb holds E2B's envd Connect services as Go code: process/
// and filesystem/ are generated (make proto) from E2B's own .proto files,
// kept as they are (package, service, method names, field numbers), so
// the SDK's calls reach them on the paths and with the fields it sends.
// The generated code is checked in; building needs no protoc.
package envdpb
