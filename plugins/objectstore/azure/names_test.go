package azure

import (
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
)

// TestNameEncoding checks that encodeName is injective, decodable, and
// preserves byte order and prefixes, on random keys over an alphabet
// crowded around "[" and "\".
func TestNameEncoding(t *testing.T) {
	alphabet := []string{"[", `\`, "]", "Z", "a", "/", "!", "~", "é", "[[", "[]"}
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]string, 2000)
	for i := range keys {
		var b strings.Builder
		for n := rng.IntN(6); n >= 0; n-- {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		keys[i] = b.String()
	}
	for _, k := range keys {
		got, ok := decodeName(encodeName(k))
		if !ok || got != k {
			t.Fatalf("decodeName(encodeName(%q)) = %q, %v", k, got, ok)
		}
		if strings.Contains(encodeName(k), `\`) {
			t.Fatalf("encodeName(%q) = %q still holds a backslash", k, encodeName(k))
		}
	}
	for i := 0; i+1 < len(keys); i++ {
		a, b := keys[i], keys[i+1]
		if (a < b) != (encodeName(a) < encodeName(b)) {
			t.Fatalf("order: %q < %q is %v, but encoded %q < %q is %v", a, b, a < b, encodeName(a), encodeName(b), encodeName(a) < encodeName(b))
		}
		if strings.HasPrefix(b, a) != strings.HasPrefix(encodeName(b), encodeName(a)) {
			t.Fatalf("prefix: %q of %q is %v, encoded %v", a, b, strings.HasPrefix(b, a), !strings.HasPrefix(b, a))
		}
	}
	enc := make([]string, len(keys))
	for i, k := range keys {
		enc[i] = encodeName(k)
	}
	sort.Strings(keys)
	sort.Strings(enc)
	for i := range keys {
		if encodeName(keys[i]) != enc[i] {
			t.Fatalf("sorted orders differ at %d: %q vs %q", i, encodeName(keys[i]), enc[i])
		}
	}
	for _, bad := range []string{"[", "a[b", "[x"} {
		if _, ok := decodeName(bad); ok {
			t.Errorf("decodeName(%q) accepted a name encodeName cannot produce", bad)
		}
	}
	if got := listPrefix("ab\xc3"); got != "ab" {
		t.Errorf("listPrefix cut a partial rune to %q, want %q", got, "ab")
	}
	if got := listPrefix("ké"); got != "ké" {
		t.Errorf("listPrefix(ké) = %q", got)
	}
}
