package tpcc

import (
	"math/rand/v2"
	"strings"
)

// syllables build TPC-C customer last names from a number 0..999.
var syllables = [10]string{"BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING"}

// LastName returns the TPC-C last name of n (0..999): three syllables from
// its decimal digits.
func LastName(n int) string {
	return syllables[n/100] + syllables[(n/10)%10] + syllables[n%10]
}

// Constants are the C values of NURand. Load and run use different C for
// last names, within the spec's allowed distance, so that the run does not
// hit exactly the names the loader favoured.
type Constants struct {
	CLast, CID, OLIID int
}

// LoadConstants and RunConstants satisfy the spec's rule 65 <= |CRun-CLoad|
// <= 119 with the difference not 96 or 112.
var (
	LoadConstants = Constants{CLast: 157, CID: 259, OLIID: 7911}
	RunConstants  = Constants{CLast: 223, CID: 259, OLIID: 7911}
)

// Rand is a per-goroutine generator of TPC-C values; it is not safe for
// concurrent use.
type Rand struct {
	r *rand.Rand
	C Constants
}

// NewRand returns a generator seeded with seed.
func NewRand(seed uint64, c Constants) *Rand {
	return &Rand{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), C: c}
}

// Int returns a uniform integer in [lo, hi].
func (g *Rand) Int(lo, hi int) int { return lo + g.r.IntN(hi-lo+1) }

// Float returns a uniform float in [lo, hi).
func (g *Rand) Float(lo, hi float64) float64 { return lo + g.r.Float64()*(hi-lo) }

// NURand is TPC-C's non-uniform random function NURand(A, x, y).
func (g *Rand) NURand(a, x, y int) int {
	var c int
	switch a {
	case 255:
		c = g.C.CLast
	case 1023:
		c = g.C.CID
	case 8191:
		c = g.C.OLIID
	}
	return (((g.Int(0, a) | g.Int(x, y)) + c) % (y - x + 1)) + x
}

// CustomerID returns a customer id 1..3000 by NURand(1023).
func (g *Rand) CustomerID() int { return g.NURand(1023, 1, CustomersPerDistrict) }

// ItemID returns an item id 1..100000 by NURand(8191).
func (g *Rand) ItemID() int { return g.NURand(8191, 1, Items) }

// RunLastName returns a last name by NURand(255, 0, 999).
func (g *Rand) RunLastName() string { return LastName(g.NURand(255, 0, 999)) }

const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

// AString returns a random alphanumeric string of length lo..hi.
func (g *Rand) AString(lo, hi int) string {
	n := g.Int(lo, hi)
	b := make([]byte, n)
	for i := range b {
		b[i] = alnum[g.r.IntN(len(alnum))]
	}
	return string(b)
}

// NString returns a random numeric string of length lo..hi.
func (g *Rand) NString(lo, hi int) string {
	n := g.Int(lo, hi)
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('0' + g.r.IntN(10))
	}
	return string(b)
}

// Zip returns a TPC-C zip code: 4 random digits and "11111".
func (g *Rand) Zip() string { return g.NString(4, 4) + "11111" }

// Data returns i_data / s_data: 26..50 characters, 10% containing "ORIGINAL".
func (g *Rand) Data() string {
	s := g.AString(26, 50)
	if g.Int(1, 10) == 1 {
		p := g.Int(0, len(s)-8)
		s = s[:p] + "ORIGINAL" + s[p+8:]
	}
	return s
}

// Perm returns a random permutation of 1..n.
func (g *Rand) Perm(n int) []int {
	p := g.r.Perm(n)
	for i := range p {
		p[i]++
	}
	return p
}

func pad(s string, n int) string {
	if len(s) >= n {
		return s[:n]
	}
	return s + strings.Repeat(" ", n-len(s))
}
