package main

import (
	"slices"
	"testing"
)

// TestWithoutFlag: the supervisor's child arguments lose the flag in both
// spellings, with its value when it takes one, and nothing else.
func TestWithoutFlag(t *testing.T) {
	args := []string{"compute", "--restart-on-crash", "--import-from", "/a", "--port", "1", "--import-from=/b", "--restart-on-crash=true", "--x"}
	if got, want := withoutFlag(args, "restart-on-crash", false), []string{"compute", "--import-from", "/a", "--port", "1", "--import-from=/b", "--x"}; !slices.Equal(got, want) {
		t.Errorf("without --restart-on-crash: %q, want %q", got, want)
	}
	if got, want := withoutFlag(args, "import-from", true), []string{"compute", "--restart-on-crash", "--port", "1", "--restart-on-crash=true", "--x"}; !slices.Equal(got, want) {
		t.Errorf("without --import-from: %q, want %q", got, want)
	}
}
