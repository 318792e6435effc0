package fsm

import (
	"strings"
	"unicode/utf8"
)

// MaxNameBytesLimit is the longest name any configuration accepts (the
// largest Config.MaxNameBytes).
const MaxNameBytesLimit = 64 << 10

// RolePrefix starts the key of every leader-election role. Lock names cannot
// contain NUL, so roles and locks never collide.
const RolePrefix = "\x00"

// ValidKey reports whether key is a valid lock name or a valid role key
// (RolePrefix followed by a valid name).
func ValidKey(key string, maxBytes int) bool {
	if strings.HasPrefix(key, RolePrefix) {
		return ValidName(key[len(RolePrefix):], maxBytes)
	}
	return ValidName(key, maxBytes)
}

// ValidName reports whether name is a valid lock name: 1..maxBytes bytes of
// valid UTF-8 without a NUL byte. No name is valid when maxBytes < 1.
func ValidName(name string, maxBytes int) bool {
	return len(name) > 0 && len(name) <= maxBytes &&
		strings.IndexByte(name, 0) < 0 && utf8.ValidString(name)
}
