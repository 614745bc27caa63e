package policy

// LRU evicts the least recently used item. A one-time scan larger than the
// cache flushes everything else out: that is the behaviour S3-FIFO fixes.
type LRU struct {
	l links
	q list
}

var _ Policy = (*LRU)(nil)

// NewLRU returns an empty LRU policy.
func NewLRU() *LRU { return &LRU{q: newList()} }

func (p *LRU) Name() string          { return "lru" }
func (p *LRU) SetCapacity(int)       {}
func (p *LRU) Len() int              { return p.q.n }
func (p *LRU) Remove(h int32)        { p.q.unlink(&p.l, h) }
func (p *LRU) Victim() (int32, bool) { return p.q.popTail(&p.l) }

func (p *LRU) Insert(h int32, _ uint64) {
	p.l.grow(h)
	p.q.pushHead(&p.l, h)
}

func (p *LRU) Touch(h int32) {
	if p.q.head == h {
		return
	}
	p.q.unlink(&p.l, h)
	p.q.pushHead(&p.l, h)
}
