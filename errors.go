package harebox

import (
	"errors"
	"strings"

	"google.golang.org/grpc/codes"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/agent/transport"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/sandbox"
)

// The engine speaks one error vocabulary, sandbox's kinds: what the agent
// and the hypervisor report is translated here, once.

// agentErr classifies an agent failure for the API.
func agentErr(err error) error {
	// (The engine's own reason for a call it cut short: closeAgent.)
	var se *sandbox.Error
	if errors.As(err, &se) {
		return se
	}
	if errors.Is(err, agentclient.ErrAgentTooOld) {
		return &sandbox.Error{Kind: sandbox.ErrState, Msg: "the sandbox's agent is too old for this server: make the sandbox again from an image built with this release", Err: err}
	}
	if errors.Is(err, transport.ErrAgentReplaced) {
		return &sandbox.Error{Kind: sandbox.ErrUnavailable, Msg: "the sandbox's agent restarted during the call; its outcome is unknown", Err: err}
	}
	switch agentclient.Code(err) {
	case codes.InvalidArgument:
		return &sandbox.Error{Kind: sandbox.ErrInvalid, Msg: "the sandbox refused the request", Err: err}
	case codes.NotFound:
		return &sandbox.Error{Kind: sandbox.ErrNotFound, Msg: "not found in the sandbox", Err: err}
	case codes.AlreadyExists:
		return &sandbox.Error{Kind: sandbox.ErrExists, Msg: "already exists in the sandbox", Err: err}
	case codes.PermissionDenied, codes.FailedPrecondition:
		return &sandbox.Error{Kind: sandbox.ErrState, Msg: "the sandbox refused the request", Err: err}
	case codes.Unimplemented:
		// An agent from an older image, which a sandbox keeps across
		// server upgrades.
		return &sandbox.Error{Kind: sandbox.ErrInvalid, Msg: "the sandbox's agent is older than this server and cannot do this: make the sandbox from an image built with this release", Err: err}
	case codes.DeadlineExceeded:
		return &sandbox.Error{Kind: sandbox.ErrTimeout, Msg: "the sandbox did not answer in time", Err: err}
	}
	return &sandbox.Error{Kind: sandbox.ErrUnavailable, Msg: "the sandbox's agent failed", Err: err}
}

// hvErr classifies a hypervisor failure. Errors that already are engine
// errors pass unchanged.
func hvErr(err error) error {
	var se *sandbox.Error
	if err == nil || errors.As(err, &se) {
		return err
	}
	if strings.Contains(strings.ToLower(err.Error()), "no space left on device") {
		// A full data directory, said by a VMM or qemu-img behind the
		// plugin boundary, where only the message travels.
		return &sandbox.Error{Kind: sandbox.ErrCapacity, Msg: "the data directory's disk is full", Err: err}
	}
	for _, m := range []struct {
		kind, to error
		msg      string
	}{
		{hypervisor.ErrInvalid, sandbox.ErrInvalid, "the hypervisor refused the request"},
		{hypervisor.ErrUnsupported, sandbox.ErrInvalid, "the hypervisor backend cannot do this"},
		{hypervisor.ErrState, sandbox.ErrState, "the sandbox's VM is not in a state that allows this"},
		{hypervisor.ErrExists, sandbox.ErrExists, "the sandbox's VM already exists"},
		{hypervisor.ErrNotFound, sandbox.ErrUnavailable, "the sandbox's VM is gone"},
	} {
		if errors.Is(err, m.kind) {
			return &sandbox.Error{Kind: m.to, Msg: m.msg, Err: err}
		}
	}
	return &sandbox.Error{Kind: sandbox.ErrUnavailable, Msg: "the hypervisor failed", Err: err}
}
