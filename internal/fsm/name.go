package fsm

import (
	"strings"
	"unicode/utf8"
)

// ValidName reports whether name is a valid lock name: 1..maxBytes bytes of
// valid UTF-8 without a NUL byte. No name is valid when maxBytes < 1.
func ValidName(name string, maxBytes int) bool {
	return len(name) > 0 && len(name) <= maxBytes &&
		strings.IndexByte(name, 0) < 0 && utf8.ValidString(name)
}
