// Package pricing parses hand-written hourly prices and estimates prices for
// machine shapes that have none. It does no I/O, and its parsers never panic.
package pricing

import (
	"fmt"
	"github.com/autonode/karpenter-clusterapi/pkg/annotation"
	"math"
	"strconv"
	"strings"
)

// MaxPriceLength is the longest price string (after trimming surrounding
// whitespace) that ParsePrice accepts.
const MaxPriceLength = 64

// MaxPrice is the largest hourly price ParsePrice accepts. Anything above it
// is taken to be a typo.
const MaxPrice = 1e6

// FieldError is a bad annotation value; Error() names the key and quotes the value.
type FieldError = annotation.FieldError

// quote quotes a value for a message, eliding the middle of huge ones.
func quote(s string) string { return annotation.Quote(s) }

// ParsePrice parses an hourly price written by a user in an annotation: a
// positive, finite decimal like "0.096" or "1.5".
//
// The value must be plain decimal notation: digits with at most one ".", and
// at least one digit (".5" and "5." are accepted). Surrounding whitespace is
// allowed. Rejected, with a *FieldError naming key and value: "", "free",
// signs ("-1", "+1"), zero ("0", "0.000"), "NaN", "Inf", exponents ("1e3",
// "1e400"), hex floats ("0x1p-2"), underscores ("1_000"), commas ("1,5"),
// surrounding junk ("$1", "1.5/h"), strings longer than MaxPriceLength bytes
// and prices above MaxPrice.
func ParsePrice(key, value string) (float64, *FieldError) {
	fail := func(format string, args ...any) (float64, *FieldError) {
		return 0, &FieldError{Key: key, Value: value, Reason: fmt.Sprintf(format, args...)}
	}
	s := strings.TrimSpace(value)
	if s == "" {
		return fail("is not a price: empty")
	}
	if len(s) > MaxPriceLength {
		return fail("is not a price: longer than %d characters", MaxPriceLength)
	}
	if s[0] == '-' && isDecimal(s[1:]) {
		return fail("must be greater than zero")
	}
	if !isDecimal(s) {
		return fail("is not a decimal number like 0.096")
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil { // unreachable: a short plain decimal always parses
		return fail("is not a decimal number like 0.096: %v", err)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return fail("is not a finite number")
	}
	if f <= 0 {
		return fail("must be greater than zero")
	}
	if f > MaxPrice {
		return fail("is too large: must be at most %g", float64(MaxPrice))
	}
	return f, nil
}

// isDecimal reports whether s is digits with at most one '.', and at least one digit.
func isDecimal(s string) bool {
	digits, dots := 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case '0' <= c && c <= '9':
			digits++
		case c == '.':
			dots++
		default:
			return false
		}
	}
	return digits > 0 && dots <= 1
}
