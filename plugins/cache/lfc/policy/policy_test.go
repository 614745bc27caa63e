package policy

import (
	"math/rand/v2"
	"testing"
)

// simCache drives a policy like the LFC does: a fixed number of slots,
// handles allocated from a free list, a victim evicted when full.
type simCache struct {
	p      Policy
	cap    int
	handle map[uint64]int32 // key -> handle
	key    map[int32]uint64
	free   []int32
	next   int32
	hits   int
	evict  int
}

func newSim(p Policy, capacity int) *simCache {
	p.SetCapacity(capacity)
	return &simCache{p: p, cap: capacity, handle: map[uint64]int32{}, key: map[int32]uint64{}}
}

func (c *simCache) access(t testing.TB, k uint64) bool {
	if h, ok := c.handle[k]; ok {
		c.p.Touch(h)
		c.hits++
		return true
	}
	if len(c.handle) == c.cap {
		v, ok := c.p.Victim()
		if !ok {
			t.Fatalf("%s: no victim with %d resident", c.p.Name(), len(c.handle))
		}
		vk, ok := c.key[v]
		if !ok {
			t.Fatalf("%s: victim %d is not resident", c.p.Name(), v)
		}
		delete(c.handle, vk)
		delete(c.key, v)
		c.free = append(c.free, v)
		c.evict++
	}
	var h int32
	if n := len(c.free); n > 0 {
		h, c.free = c.free[n-1], c.free[:n-1]
	} else {
		h = c.next
		c.next++
	}
	c.handle[k] = h
	c.key[h] = k
	c.p.Insert(h, k*0x9E3779B97F4A7C15)
	return false
}

func (c *simCache) remove(k uint64) {
	if h, ok := c.handle[k]; ok {
		c.p.Remove(h)
		delete(c.handle, k)
		delete(c.key, h)
		c.free = append(c.free, h)
	}
}

func each(t *testing.T, f func(t *testing.T, name string)) {
	for _, n := range Names {
		t.Run(n, func(t *testing.T) { f(t, n) })
	}
}

func mustNew(t testing.TB, name string) Policy {
	p, err := New(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRandomOps checks the bookkeeping of every policy under a random mix of
// accesses and removals: victims are always resident, Len matches, and the
// cache drains completely.
func TestRandomOps(t *testing.T) {
	each(t, func(t *testing.T, name string) {
		c := newSim(mustNew(t, name), 50)
		r := rand.New(rand.NewPCG(1, 2))
		for i := 0; i < 20000; i++ {
			k := uint64(r.IntN(200))
			if r.IntN(10) == 0 {
				c.remove(k)
			} else {
				c.access(t, k)
			}
			if c.p.Len() != len(c.handle) {
				t.Fatalf("op %d: Len %d, %d resident", i, c.p.Len(), len(c.handle))
			}
		}
		seen := map[int32]bool{}
		for len(c.handle) > 0 {
			v, ok := c.p.Victim()
			if !ok || seen[v] {
				t.Fatalf("drain: victim %d ok=%v repeated=%v", v, ok, seen[v])
			}
			if _, ok := c.key[v]; !ok {
				t.Fatalf("drain: victim %d not resident", v)
			}
			seen[v] = true
			delete(c.handle, c.key[v])
			delete(c.key, v)
		}
		if _, ok := c.p.Victim(); ok || c.p.Len() != 0 {
			t.Fatalf("empty policy still has a victim or Len %d", c.p.Len())
		}
	})
}

func TestUnknown(t *testing.T) {
	if _, err := New("arc"); err == nil {
		t.Fatal("New(arc) succeeded")
	}
}

func TestLRUOrder(t *testing.T) {
	p := NewLRU()
	for h := int32(0); h < 4; h++ {
		p.Insert(h, 0)
	}
	p.Touch(0) // order from oldest: 1 2 3 0
	p.Touch(2) // 1 3 0 2
	p.Remove(3)
	for _, want := range []int32{1, 0, 2} {
		if v, _ := p.Victim(); v != want {
			t.Fatalf("victim %d, want %d", v, want)
		}
	}
}

func TestClockSecondChance(t *testing.T) {
	p := NewClock()
	for h := int32(0); h < 4; h++ {
		p.Insert(h, 0)
	}
	p.Touch(0)
	p.Touch(1)
	// 0 and 1 are referenced: the sweep clears them and evicts 2, then 3,
	// then (bits now clear) 0.
	for _, want := range []int32{2, 3, 0} {
		if v, _ := p.Victim(); v != want {
			t.Fatalf("victim %d, want %d", v, want)
		}
	}
}

// TestScanResistance: a hot working set of 60 items is accessed repeatedly in
// a cache of 100, then a one-time scan of 5,000 new items passes through.
// Under S3-FIFO the whole working set survives; under LRU none of it does.
func TestScanResistance(t *testing.T) {
	survivors := func(name string) int {
		c := newSim(mustNew(t, name), 100)
		for round := 0; round < 5; round++ {
			for k := uint64(0); k < 60; k++ {
				c.access(t, k)
			}
		}
		for k := uint64(1000); k < 6000; k++ {
			c.access(t, k)
		}
		n := 0
		for k := uint64(0); k < 60; k++ {
			if _, ok := c.handle[k]; ok {
				n++
			}
		}
		return n
	}
	if n := survivors("s3fifo"); n != 60 {
		t.Errorf("s3fifo: %d of 60 hot items survived the scan, want all", n)
	}
	if n := survivors("lru"); n != 0 {
		t.Errorf("lru: %d of 60 hot items survived the scan, want none", n)
	}
	if n := survivors("clock"); n == 60 {
		t.Errorf("clock: the whole working set survived a scan 50x the cache; sweep broken?")
	}
}

// TestS3FIFOGhost: an item evicted from the small queue without a hit
// and inserted again soon after goes to the main queue.
func TestS3FIFOGhost(t *testing.T) {
	p := NewS3FIFO()
	p.SetCapacity(10)
	p.Insert(0, 111)
	if v, ok := p.Victim(); !ok || v != 0 {
		t.Fatalf("victim %d %v", v, ok)
	}
	p.Insert(1, 111) // same key hash: readmitted to M
	p.Insert(2, 222) // new: S
	if !p.inM[1] || p.inM[2] {
		t.Fatalf("inM = %v %v, want true false", p.inM[1], p.inM[2])
	}
	// S (1 item >= target 1) is evicted before M.
	if v, _ := p.Victim(); v != 2 {
		t.Fatalf("victim %d, want 2 (from S)", v)
	}
}

// TestHitRatioSkewed: on a Zipf-like workload with a periodic scan, S3-FIFO's
// hit ratio is at least LRU's.
func TestHitRatioSkewed(t *testing.T) {
	ratio := func(name string) float64 {
		c := newSim(mustNew(t, name), 500)
		r := rand.New(rand.NewPCG(7, 7))
		z := rand.NewZipf(r, 1.1, 1, 20000)
		n := 0
		for i := 0; i < 200000; i++ {
			if i%20000 == 0 { // a scan of 2,000 new keys
				for k := 0; k < 2000; k++ {
					c.access(t, uint64(1_000_000+i+k))
				}
			}
			c.access(t, z.Uint64())
			n++
		}
		return float64(c.hits) / float64(n)
	}
	lru, s3 := ratio("lru"), ratio("s3fifo")
	t.Logf("hit ratio: lru %.3f s3fifo %.3f clock %.3f", lru, s3, ratio("clock"))
	if s3 < lru {
		t.Errorf("s3fifo hit ratio %.3f below lru %.3f", s3, lru)
	}
}

func BenchmarkPolicy(b *testing.B) {
	for _, name := range Names {
		b.Run(name, func(b *testing.B) {
			c := newSim(mustNew(b, name), 4096)
			r := rand.New(rand.NewPCG(3, 3))
			z := rand.NewZipf(r, 1.1, 1, 100000)
			keys := make([]uint64, 1<<16)
			for i := range keys {
				keys[i] = z.Uint64()
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c.access(b, keys[i&(len(keys)-1)])
			}
			b.ReportMetric(float64(c.hits)/float64(b.N), "hitratio")
		})
	}
}
