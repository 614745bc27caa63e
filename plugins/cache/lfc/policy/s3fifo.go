package policy

// S3FIFO is the scan-resistant policy of Yang et al., "FIFO queues are all
// you need for cache eviction" (SOSP 2023). New items enter a small FIFO
// queue S (10% of the capacity); an item evicted from S that was hit while
// there moves to the main FIFO M, otherwise it leaves and its key hash goes
// into a ghost FIFO G. An item inserted while its hash is in G goes straight
// to M. M evicts with a 2-bit frequency counter (CLOCK-like reinsertion).
// A one-time scan therefore only churns S and never pushes the working set
// out of M.
type S3FIFO struct {
	l     links
	s, m  list
	inM   []bool
	freq  []uint8
	hash  []uint64
	cap   int
	ghost ghost
}

var _ Policy = (*S3FIFO)(nil)

// NewS3FIFO returns an empty S3-FIFO policy.
func NewS3FIFO() *S3FIFO { return &S3FIFO{s: newList(), m: newList()} }

func (p *S3FIFO) Name() string { return "s3fifo" }
func (p *S3FIFO) Len() int     { return p.s.n + p.m.n }

// SetCapacity sizes S (10%) and G (as many hashes as M holds items).
func (p *S3FIFO) SetCapacity(n int) {
	p.cap = n
	p.ghost.resize(max(n-n/10, 1))
}

func (p *S3FIFO) smallTarget() int { return max(p.cap/10, 1) }

func (p *S3FIFO) grow(h int32) {
	p.l.grow(h)
	for int(h) >= len(p.inM) {
		p.inM = append(p.inM, false)
		p.freq = append(p.freq, 0)
		p.hash = append(p.hash, 0)
	}
}

func (p *S3FIFO) Insert(h int32, hash uint64) {
	p.grow(h)
	p.freq[h] = 0
	p.hash[h] = hash
	if p.ghost.remove(hash) {
		p.inM[h] = true
		p.m.pushHead(&p.l, h)
		return
	}
	p.inM[h] = false
	p.s.pushHead(&p.l, h)
}

func (p *S3FIFO) Touch(h int32) {
	if p.freq[h] < 3 {
		p.freq[h]++
	}
}

func (p *S3FIFO) Remove(h int32) {
	if p.inM[h] {
		p.m.unlink(&p.l, h)
	} else {
		p.s.unlink(&p.l, h)
	}
}

func (p *S3FIFO) Victim() (int32, bool) {
	for p.Len() > 0 {
		if p.s.n > 0 && (p.s.n >= p.smallTarget() || p.m.n == 0) {
			h, _ := p.s.popTail(&p.l)
			if p.freq[h] > 0 {
				p.freq[h] = 0
				p.inM[h] = true
				p.m.pushHead(&p.l, h)
				continue
			}
			p.ghost.add(p.hash[h])
			return h, true
		}
		h, _ := p.m.popTail(&p.l)
		if p.freq[h] > 0 {
			p.freq[h]--
			p.m.pushHead(&p.l, h)
			continue
		}
		return h, true
	}
	return -1, false
}

// ghost is a bounded FIFO set of key hashes.
type ghost struct {
	ring  []uint64
	next  int
	full  bool
	count map[uint64]int
}

func (g *ghost) resize(n int) {
	if n == len(g.ring) {
		return
	}
	g.ring = make([]uint64, n)
	g.next, g.full = 0, false
	g.count = make(map[uint64]int, n)
}

func (g *ghost) add(h uint64) {
	if len(g.ring) == 0 {
		return
	}
	if g.full {
		old := g.ring[g.next]
		if c := g.count[old]; c <= 1 {
			delete(g.count, old)
		} else {
			g.count[old] = c - 1
		}
	}
	g.ring[g.next] = h
	g.count[h]++
	g.next++
	if g.next == len(g.ring) {
		g.next, g.full = 0, true
	}
}

// remove reports whether h is in the ghost set and forgets it (the ring
// slot stays, and is skipped when it expires).
func (g *ghost) remove(h uint64) bool {
	c, ok := g.count[h]
	if !ok {
		return false
	}
	if c <= 1 {
		delete(g.count, h)
	} else {
		g.count[h] = c - 1
	}
	return true
}
