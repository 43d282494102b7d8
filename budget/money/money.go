// Package money holds amounts of money: exact micro-dollars, parsed and
// printed as decimal strings, never floats.
package money

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
)

// USD is an amount of money in micro-dollars: exact, never a float.
type USD int64

// MaxUSD bounds an amount (one trillion dollars): sums of amounts are
// capped at it (min(MaxUSD, a+b) with both at most MaxUSD cannot
// overflow an int64).
const MaxUSD = USD(1_000_000_000_000 * 1_000_000)

// ParseUSD parses a decimal dollar amount such as "25", "25.5" or
// "0.000001" (at most six decimals, not negative).
func ParseUSD(s string) (USD, error) {
	whole, frac, dot := strings.Cut(s, ".")
	if whole == "" || (dot && (frac == "" || len(frac) > 6)) || strings.TrimLeft(whole+frac, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a dollar amount (digits, at most six decimals)", s)
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w > int64(MaxUSD/1_000_000) {
		return 0, fmt.Errorf("%q is too large", s)
	}
	f := int64(0)
	if frac != "" {
		f, _ = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64)
	}
	v := USD(w*1_000_000 + f)
	if v > MaxUSD {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return v, nil
}

// String formats the amount with at least two decimals: "25.00", "0.000001".
func (u USD) String() string {
	sign := ""
	v := int64(u)
	if v < 0 {
		if v == math.MinInt64 {
			return "-?"
		}
		sign, v = "-", -v
	}
	frac := strings.TrimRight(fmt.Sprintf("%06d", v%1_000_000), "0")
	for len(frac) < 2 {
		frac += "0"
	}
	return fmt.Sprintf("%s%d.%s", sign, v/1_000_000, frac)
}

// MarshalJSON writes the amount as a decimal string, so no client reads it
// into a float.
func (u USD) MarshalJSON() ([]byte, error) { return json.Marshal(u.String()) }

// UnmarshalJSON reads a decimal string (or a JSON number written as one).
func (u *USD) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	v, err := ParseUSD(s)
	if err != nil {
		// A type error, so that the decoder names the field; Value says
		// why.
		return &json.UnmarshalTypeError{Value: err.Error(), Type: reflect.TypeFor[USD]()}
	}
	*u = v
	return nil
}
