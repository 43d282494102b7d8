package envd

import (
	"context"

	"github.com/harebox/harebox/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/harebox/harebox/sandbox"
)

// Filesystem is the engine's file calls envd's filesystem service makes
// (harebox.Engine has them), each authorized and audited by the engine
// for the principal in the context.
type Filesystem interface {
	StatFile(ctx context.Context, id, path string) (*sandbox.FileInfo, error)
}

// filesystemService is envd's filesystem service; a call it does not
// serve answers unimplemented.
type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	s *Server
}
