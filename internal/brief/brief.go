// Package brief shortens lists for messages meant for people.
package brief

import "strings"

// Join joins at most the first n items of s with ", ", ending in ", ..."
// when it left some out.
func Join(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, ", ")
	}
	return strings.Join(s[:n], ", ") + ", ..."
}
