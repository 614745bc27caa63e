package brief

import "testing"

func TestJoin(t *testing.T) {
	for _, c := range []struct {
		s    []string
		n    int
		want string
	}{
		{nil, 3, ""},
		{[]string{"a"}, 3, "a"},
		{[]string{"a", "b", "c"}, 3, "a, b, c"},
		{[]string{"a", "b", "c", "d"}, 3, "a, b, c, ..."},
	} {
		if got := Join(c.s, c.n); got != c.want {
			t.Errorf("Join(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}
