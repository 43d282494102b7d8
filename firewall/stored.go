package firewall

import (
	"encoding/json"
	"errors"

	"github.com/harebox/harebox/model"
)

// RecordKey is where a sandbox's record keeps its policy (its extras).
const RecordKey = "firewall"

// Stored is the policy a sandbox's record keeps (raw, under RecordKey):
// Default when it keeps none (a record from before policies).
func Stored(raw json.RawMessage) (*Policy, error) {
	if raw == nil {
		return Default(), nil
	}
	return Parse(raw)
}

// Requested is what a new sandbox's record keeps under RecordKey: the
// create's policy (raw), or def without one, so that a later change of
// the default leaves existing sandboxes as they are; nil for neither. A
// bad policy is model.ErrInvalid naming its field under "firewall".
func Requested(raw json.RawMessage, def *Policy) (json.RawMessage, error) {
	p := def
	if raw != nil {
		var err error
		if p, err = Parse(raw); err != nil {
			var fe *Error
			if errors.As(err, &fe) {
				field := "firewall"
				if fe.Field != "" {
					field += "." + fe.Field
				}
				return nil, model.Errorf(model.ErrInvalid, field, "%s", fe.Msg)
			}
			return nil, &model.Error{Kind: model.ErrInvalid, Field: "firewall", Msg: "invalid firewall policy", Err: err}
		}
	}
	if p == nil {
		return nil, nil
	}
	return json.Marshal(p)
}
