// Package model is HareBox's one vocabulary: the error kinds every layer
// speaks (the engine, the domains, the store's callers, the REST API and
// its Go client), and the domain records that the store keeps and the API
// returns as they are (records.go). It imports nothing of HareBox, so
// anything may import it. An error is translated into a kind once, where it enters (the
// hypervisor, the agent, the store, a request), and checked with
// errors.Is everywhere after.
package model

import (
	"errors"
	"fmt"
	"time"
)

// Error kinds; check with errors.Is. Code names each on the wire.
var (
	ErrInvalid     = errors.New("invalid")        // 400
	ErrNotFound    = errors.New("not found")      // 404
	ErrState       = errors.New("invalid state")  // 409
	ErrExists      = errors.New("already exists") // 409
	ErrCapacity    = errors.New("over capacity")  // 503 (or 429)
	ErrTooLarge    = errors.New("too large")      // 413
	ErrUnavailable = errors.New("unavailable")    // 503
	ErrTimeout     = errors.New("timed out")      // 504
	// ErrUnauthenticated: no valid credential (a missing, wrong, expired
	// or revoked key).
	ErrUnauthenticated = errors.New("unauthenticated") // 401
	// ErrForbidden: the caller's key does not allow the action. An object
	// the key may not see is ErrNotFound instead, so a denial never
	// confirms that it exists.
	ErrForbidden = errors.New("forbidden") // 403
	// ErrRateLimited: the key's request rate is spent; RetryAfter says
	// when to try again.
	ErrRateLimited = errors.New("rate limited") // 429
	// ErrBudget: a budget that covers the request has no room for it.
	ErrBudget = errors.New("budget exceeded") // 402
)

// Kinds are the error kinds with their wire code and HTTP status, in the
// order they are matched (the first kind an error is wins).
var Kinds = []struct {
	Kind   error
	Code   string
	Status int
}{
	{ErrInvalid, "invalid", 400},
	{ErrNotFound, "not_found", 404},
	{ErrState, "conflict", 409},
	{ErrExists, "conflict", 409},
	{ErrTooLarge, "too_large", 413},
	{ErrCapacity, "over_capacity", 503},
	{ErrUnavailable, "unavailable", 503},
	{ErrTimeout, "timeout", 504},
	{ErrUnauthenticated, "unauthorized", 401},
	{ErrForbidden, "forbidden", 403},
	{ErrRateLimited, "rate_limited", 429},
	{ErrBudget, "budget_exceeded", 402},
}

// CodeInternal is the code of an error of no kind: a server-side fault.
const CodeInternal = "internal"

// Code names err's kind on the wire (the REST API's error code, the audit
// log's error), never its message; CodeInternal if it has none.
func Code(err error) string {
	for _, k := range Kinds {
		if errors.Is(err, k.Kind) {
			return k.Code
		}
	}
	return CodeInternal
}

// Error is an error of a kind: the request field at fault (if any, as a
// JSON path such as "size.vcpus") and a message for people.
type Error struct {
	Kind  error
	Field string
	Msg   string
	Err   error // the underlying cause, if any
	// RetryAfter, for ErrRateLimited, is how long to wait.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	msg := e.Msg
	if e.Field != "" {
		msg = e.Field + ": " + msg
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is matches the kind.
func (e *Error) Is(target error) bool { return target == e.Kind }

// Unwrap exposes the cause.
func (e *Error) Unwrap() error { return e.Err }

// Errorf builds an *Error of kind for field.
func Errorf(kind error, field, format string, args ...any) error {
	return &Error{Kind: kind, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// FieldOf returns the field an error names, or "".
func FieldOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Field
	}
	return ""
}
