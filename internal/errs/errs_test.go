package errs

import (
	"errors"
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
	// Clip, the cut Quote makes (and the relay's via, gRPC's messages).
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abc", 3, "abc"},
		{"abcdef", 3, "abc"},
		{"aéb", 2, "a"}, // "é" is 2 bytes: not split
		{"éé", 0, ""},
	} {
		if got := Clip(tc.in, tc.n); got != tc.want {
			t.Errorf("Clip(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestCheckName(t *testing.T) {
	if err := CheckName("task id", "ppo-run 7/é", 16); err != nil {
		t.Fatalf("a printable name within the bound: %v", err)
	}
	for _, tc := range []struct{ in, want string }{
		{strings.Repeat("x", 17), "longer than 16 bytes"},
		{"a\x00b", "unprintable"},
		{"tab\there", "unprintable"},
	} {
		err := CheckName("task id", tc.in, 16)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "task id") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckName(%q) = %v, want ErrInvalid naming the task id, %q", tc.in, err, tc.want)
		}
	}
	if err := CheckName("worker name", strings.Repeat("y", 1<<20), 128); len(err.Error()) > 200 {
		t.Errorf("the error echoes the input: %d bytes", len(err.Error()))
	}
}
