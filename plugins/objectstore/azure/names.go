package azure

import (
	"strings"
	"unicode/utf8"
)

// Azure treats a backslash in a blob name as a forward slash, so the key
// "back\slash" would come back from List as "back/slash". Blob names are
// therefore an encoding of keys: "[" is written "[[" and "\" is written
// "[]"; every other byte is itself. The codes are prefix-free and ordered
// like the bytes they stand for ("[" < "\" and "[[" < "[]", and no other
// code starts with "["), so the encoding preserves byte order (List stays
// sorted) and maps a key prefix to a blob name prefix. Keys without "[" or
// "\" (all of strata's own) are stored under their own name.
var (
	nameEncoder = strings.NewReplacer("[", "[[", `\`, "[]")
	nameDecoder = strings.NewReplacer("[[", "[", "[]", `\`)
)

func encodeName(key string) string { return nameEncoder.Replace(key) }

// decodeName inverts encodeName; ok is false for a name encodeName cannot
// produce (a "[" not followed by "[" or "]").
func decodeName(name string) (key string, ok bool) {
	if !strings.Contains(name, "[") {
		return name, true
	}
	key = nameDecoder.Replace(name)
	return key, encodeName(key) == name
}

// listPrefix returns the part of prefix that can be sent to the service
// (which rejects invalid UTF-8): keys are valid UTF-8, so a prefix that ends
// in a partial rune is cut back to the last whole one, and the caller
// filters the listing with the full prefix.
func listPrefix(prefix string) string {
	for len(prefix) > 0 && !utf8.ValidString(prefix) {
		_, size := utf8.DecodeLastRuneInString(prefix)
		prefix = prefix[:len(prefix)-size]
	}
	return prefix
}
