// Package annotation holds what every parser of user-written annotation
// values shares: an error that names the key and quotes the value.
package annotation

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// maxQuotedValue is how many bytes of a value Error quotes before eliding the rest.
const maxQuotedValue = 256

// FieldError is a bad annotation value. Error() names the key and quotes the
// value, e.g.
//
//	annotation "capacity.cluster-autoscaler.kubernetes.io/cpu": "lots" is not a quantity: ...
type FieldError struct {
	// Key is the annotation key.
	Key string
	// Value is the annotation value, as written.
	Value string
	// Reason says what is wrong, as a predicate of the value ("is not a quantity: ...").
	Reason string
}

// Errorf returns a FieldError for key and value with a formatted reason.
func Errorf(key, value, format string, args ...any) *FieldError {
	return &FieldError{Key: key, Value: value, Reason: fmt.Sprintf(format, args...)}
}

// Error implements error. Values longer than 256 bytes are quoted in part,
// followed by their total length.
func (e *FieldError) Error() string {
	if e == nil {
		return "<nil>"
	}
	return fmt.Sprintf("annotation %q: %s %s", e.Key, Quote(e.Value), e.Reason)
}

// Quote quotes s like %q, eliding everything after the first 256 bytes (cut at
// a rune boundary) so that a huge value cannot produce a huge message.
func Quote(s string) string {
	if len(s) <= maxQuotedValue {
		return strconv.Quote(s)
	}
	i := maxQuotedValue
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(s[:i]), len(s))
}
