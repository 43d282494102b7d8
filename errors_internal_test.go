package harebox

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/sandbox"
)

// An agent older than the server (a sandbox keeps its image's agent across
// upgrades) is told apart from a broken one, with what to do about it.
func TestAgentErrOlderAgent(t *testing.T) {
	for _, c := range []struct {
		err  error
		kind error
	}{
		{fmt.Errorf("agent stat: %w", status.Error(codes.Unimplemented, "unknown method Stat")), sandbox.ErrInvalid},
		{fmt.Errorf("%w: it speaks protocol 0", agentclient.ErrAgentTooOld), sandbox.ErrState},
	} {
		got := agentErr(c.err)
		if !errors.Is(got, c.kind) || !strings.Contains(got.Error(), "image built with this release") {
			t.Errorf("%v: %v", c.err, got)
		}
	}
}
