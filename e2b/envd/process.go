package envd

import (
	"context"

	"github.com/harebox/harebox/e2b/envdpb/process/processconnect"
	"github.com/harebox/harebox/sandbox"
)

// Processes is the calls envd's process service makes on a sandbox's
// processes (processes.Service has them), each authorized and audited
// for the principal in the context.
type Processes interface {
	List(ctx context.Context, id string) ([]sandbox.Process, error)
}

// processService is envd's process service; a call it does not serve
// answers unimplemented.
type processService struct {
	processconnect.UnimplementedProcessHandler
	s *Server
}
