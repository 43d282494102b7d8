package sandbox

import "github.com/harebox/harebox/model"

// The error kinds, from the one vocabulary (package model); check with
// errors.Is. These names remain for the engine's callers.
var (
	ErrInvalid         = model.ErrInvalid
	ErrNotFound        = model.ErrNotFound
	ErrState           = model.ErrState
	ErrExists          = model.ErrExists
	ErrCapacity        = model.ErrCapacity
	ErrTooLarge        = model.ErrTooLarge
	ErrUnavailable     = model.ErrUnavailable
	ErrTimeout         = model.ErrTimeout
	ErrUnauthenticated = model.ErrUnauthenticated
	ErrForbidden       = model.ErrForbidden
	ErrRateLimited     = model.ErrRateLimited
	ErrBudget          = model.ErrBudget
)

// Error is an error of a kind (model.Error).
type Error = model.Error

// Errorf builds an *Error of kind for field.
func Errorf(kind error, field, format string, args ...any) error {
	return model.Errorf(kind, field, format, args...)
}

// FieldOf returns the field an error names, or "".
func FieldOf(err error) string { return model.FieldOf(err) }
