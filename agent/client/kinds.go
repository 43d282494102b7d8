package client

import (
	"errors"

	"google.golang.org/grpc/codes"

	"github.com/harebox/harebox/agent/transport"
	"github.com/harebox/harebox/model"
)

// Every error a call returns is of one of the API's kinds (model.Error),
// given here, at the agent's boundary, once; the cause stays wrapped, so
// errors.Is, errors.As and Code see through it.

// classify gives *err its kind, for the calls' defers.
func classify(err *error) {
	if *err != nil {
		*err = kindOf(*err)
	}
}

// kindOf is what an agent failure is for the API.
func kindOf(err error) error {
	// (One with a kind already, e.g. why the host hung up: CloseFor.)
	var me *model.Error
	if errors.As(err, &me) {
		return me
	}
	if errors.Is(err, ErrAgentTooOld) {
		return &model.Error{Kind: model.ErrState, Msg: "the sandbox's agent is too old for this server: make the sandbox again from an image built with this release", Err: err}
	}
	if errors.Is(err, transport.ErrAgentReplaced) {
		return &model.Error{Kind: model.ErrUnavailable, Msg: "the sandbox's agent restarted during the call; its outcome is unknown", Err: err}
	}
	switch Code(err) {
	case codes.InvalidArgument:
		return &model.Error{Kind: model.ErrInvalid, Msg: "the sandbox refused the request", Err: err}
	case codes.NotFound:
		return &model.Error{Kind: model.ErrNotFound, Msg: "not found in the sandbox", Err: err}
	case codes.AlreadyExists:
		return &model.Error{Kind: model.ErrExists, Msg: "already exists in the sandbox", Err: err}
	case codes.PermissionDenied, codes.FailedPrecondition:
		return &model.Error{Kind: model.ErrState, Msg: "the sandbox refused the request", Err: err}
	case codes.Unimplemented:
		// An agent from an older image, which a sandbox keeps across
		// server upgrades.
		return &model.Error{Kind: model.ErrInvalid, Msg: "the sandbox's agent is older than this server and cannot do this: make the sandbox from an image built with this release", Err: err}
	case codes.ResourceExhausted:
		// One of the guest's bounds (commands kept, watches, its disk).
		return &model.Error{Kind: model.ErrCapacity, Msg: "the sandbox is at one of its limits", Err: err}
	case codes.DeadlineExceeded:
		return &model.Error{Kind: model.ErrTimeout, Msg: "the sandbox did not answer in time", Err: err}
	}
	return &model.Error{Kind: model.ErrUnavailable, Msg: "the sandbox's agent failed", Err: err}
}
