package wire

import (
	"errors"
	"fmt"
)

// The two sentinels let callers decide with errors.Is while the message keeps
// the precise reason the proxy logs when it closes a connection.
var (
	// ErrMalformed is wrapped by every decode failure that is not about size.
	ErrMalformed = errors.New("malformed wire message")
	// ErrTooLarge is wrapped when a declared or actual size exceeds a limit.
	ErrTooLarge = errors.New("wire message too large")
)

// malformed formats a reason and wraps ErrMalformed. The reason is formatted
// separately so that vet checks call sites like any printf wrapper.
func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// tooLarge formats a reason and wraps ErrTooLarge.
func tooLarge(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrTooLarge, fmt.Sprintf(format, args...))
}
