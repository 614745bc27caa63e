package policy

// Clock is the CLOCK (second chance) approximation of LRU that Postgres'
// buffer manager also uses: a hit only sets a reference bit, so Touch writes
// one byte; Victim sweeps the handles, clearing set bits, and evicts the
// first resident handle whose bit is clear. New items start with a clear bit.
type Clock struct {
	state []uint8 // 0 absent, 1 resident, 2 resident and referenced
	hand  int
	n     int
}

var _ Policy = (*Clock)(nil)

// NewClock returns an empty CLOCK policy.
func NewClock() *Clock { return &Clock{} }

func (p *Clock) Name() string    { return "clock" }
func (p *Clock) SetCapacity(int) {}
func (p *Clock) Len() int        { return p.n }

func (p *Clock) Insert(h int32, _ uint64) {
	for int(h) >= len(p.state) {
		p.state = append(p.state, 0)
	}
	p.state[h] = 1
	p.n++
}

func (p *Clock) Touch(h int32) { p.state[h] = 2 }

func (p *Clock) Remove(h int32) {
	p.state[h] = 0
	p.n--
}

func (p *Clock) Victim() (int32, bool) {
	if p.n == 0 {
		return -1, false
	}
	// Two laps always suffice: the first clears every reference bit.
	for i := 0; i < 2*len(p.state)+1; i++ {
		if p.hand >= len(p.state) {
			p.hand = 0
		}
		h := p.hand
		p.hand++
		switch p.state[h] {
		case 2:
			p.state[h] = 1
		case 1:
			p.state[h] = 0
			p.n--
			return int32(h), true
		}
	}
	panic("policy: clock found no victim with items resident")
}
