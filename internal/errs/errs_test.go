package errs

import (
	"strconv"
	"strings"
	"testing"
)

func TestQuoteBoundsClientInput(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"learner-1", `"learner-1"`},
		{"", `""`},
		{strings.Repeat("a", MaxQuotedBytes), strconv.Quote(strings.Repeat("a", MaxQuotedBytes))},
		{strings.Repeat("a", 10<<10), strconv.Quote(strings.Repeat("a", MaxQuotedBytes)) + "…(10240 bytes)"},
		// A cut never splits a rune: "é" is 2 bytes, the 64th byte starts one.
		{"a" + strings.Repeat("é", 40), strconv.Quote("a"+strings.Repeat("é", 31)) + "…(81 bytes)"},
	} {
		if got := Quote(tc.in); got != tc.want {
			t.Errorf("Quote(%d bytes) = %s, want %s", len(tc.in), got, tc.want)
		}
	}
}
