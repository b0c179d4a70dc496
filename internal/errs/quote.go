package errs

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// MaxQuotedBytes is how many bytes of a client-supplied string Quote keeps.
const MaxQuotedBytes = 64

// Quote is %q for a string a client sent (a learner id, a model or
// client name): strings longer than MaxQuotedBytes are cut at a rune
// boundary and say how long they were, so error text, which goes back to
// the client in gRPC's status (a header, limited to 8-16 KiB by most
// peers) and into logs, never echoes unbounded input. Use it, with %s,
// wherever an error formats a string that came off the network.
func Quote(s string) string { return QuoteMax(s, MaxQuotedBytes) }

// QuoteMax is Quote keeping up to max bytes: for a peer's longer text
// worth reading whole when it is short, such as the error a learner
// reports for its share.
func QuoteMax(s string, max int) string {
	if len(s) <= max {
		return strconv.Quote(s)
	}
	return strconv.Quote(Clip(s, max)) + "…(" + strconv.Itoa(len(s)) + " bytes)"
}

// Clip is s cut to at most n bytes at a rune boundary (s itself when it
// is no longer).
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// CheckName refuses, with ErrInvalid naming what it is, a client-supplied
// name (a task id, a worker name) that the hub keeps, logs and shows:
// longer than max bytes, or holding an unprintable character.
func CheckName(what, s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%w: %s %s is longer than %d bytes", ErrInvalid, what, Quote(s), max)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: %s %s has an unprintable character", ErrInvalid, what, Quote(s))
		}
	}
	return nil
}
