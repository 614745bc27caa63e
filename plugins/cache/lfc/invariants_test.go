package lfc

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stratadb/strata/sdk/cache/cachetest"
	"github.com/stratadb/strata/sdk/pg"
)

// checkInvariants verifies the bookkeeping of every partition: slots in use,
// free and never used partition the partition's slots; the index, the
// entries and the policy agree; page counts match the bitmaps.
func (c *Cache) checkInvariants() error {
	var slots int64
	for _, p := range c.parts {
		p.mu.Lock()
		err := func() error {
			if p.hwm > p.nslots {
				return fmt.Errorf("partition %d: hwm %d > nslots %d", p.id, p.hwm, p.nslots)
			}
			used := map[int32]bool{}
			var pages int64
			for ck, h := range p.index {
				e := &p.ents[h]
				if e.key != ck {
					return fmt.Errorf("partition %d: handle %d holds %v, index says %v", p.id, h, e.key, ck)
				}
				if e.slot < 0 || e.slot >= p.hwm || used[e.slot] {
					return fmt.Errorf("partition %d: chunk %v in slot %d (hwm %d, reused %v)", p.id, ck, e.slot, p.hwm, used[e.slot])
				}
				if e.empty() {
					return fmt.Errorf("partition %d: empty chunk %v kept", p.id, ck)
				}
				used[e.slot] = true
				pages += e.count()
			}
			for _, s := range p.freeS {
				if s < 0 || s >= p.hwm || used[s] {
					return fmt.Errorf("partition %d: free slot %d (hwm %d, in use %v)", p.id, s, p.hwm, used[s])
				}
				used[s] = true
			}
			if int32(len(used)) != p.hwm {
				return fmt.Errorf("partition %d: %d slots accounted, hwm %d", p.id, len(used), p.hwm)
			}
			if p.pol.Len() != len(p.index) {
				return fmt.Errorf("partition %d: policy holds %d, index %d", p.id, p.pol.Len(), len(p.index))
			}
			if pages != p.pages {
				return fmt.Errorf("partition %d: %d pages in bitmaps, counter %d", p.id, pages, p.pages)
			}
			if p.ramTier {
				if len(p.ram) != int(p.hwm)*p.cp {
					return fmt.Errorf("partition %d: %d RAM buffers, hwm %d", p.id, len(p.ram), p.hwm)
				}
				held := map[int]bool{}
				for _, h := range p.index {
					e := &p.ents[h]
					for i := 0; i < p.cp; i++ {
						if e.has(uint32(i)) {
							held[int(e.slot)*p.cp+i] = true
						}
					}
				}
				for j, b := range p.ram {
					if (b != nil) != held[j] || (b != nil && len(b) != pg.BlockSize) {
						return fmt.Errorf("partition %d: RAM buffer %d: len %d, page held %v", p.id, j, len(b), held[j])
					}
				}
			}
			return nil
		}()
		slots += int64(p.nslots)
		p.mu.Unlock()
		if err != nil {
			return err
		}
	}
	if slots != c.slots.Load() {
		return fmt.Errorf("partitions own %d slots, cache has %d", slots, c.slots.Load())
	}
	return nil
}

// TestInvariantsRandom runs random operations, resizes included, on small
// caches and checks the bookkeeping after each one, and the bytes of every
// hit.
func TestInvariantsRandom(t *testing.T) {
	for _, v := range []struct {
		tier         string
		chunk, parts int
		pol          string
	}{
		{TierRAM, 1, 3, "s3fifo"}, {TierRAM, 4, 2, "lru"}, {TierDisk, 2, 3, "clock"}, {TierDisk, 1, 1, "s3fifo"},
	} {
		t.Run(fmt.Sprintf("%s/%d/%d/%s", v.tier, v.chunk, v.parts, v.pol), func(t *testing.T) {
			cfg := Config{SizeBytes: 40 * pg.BlockSize, Tier: v.tier, Path: filepath.Join(t.TempDir(), "f"),
				ChunkPages: v.chunk, Partitions: v.parts, Policy: v.pol}
			c := newCache(t, cfg, Options{})
			r := rand.New(rand.NewPCG(uint64(v.chunk), uint64(v.parts)))
			dst := make([]byte, pg.BlockSize)
			for op := 0; op < 4000; op++ {
				k := pg.PageKey{Spc: 1663, DB: 1, Rel: uint32(r.IntN(4)), Block: uint32(r.IntN(60))}
				switch x := r.IntN(100); {
				case x < 40:
					hit, err := c.Get(k, dst)
					if err != nil {
						t.Fatal(err)
					}
					if hit {
						if _, err := cachetest.CheckPage(k, dst); err != nil {
							t.Fatalf("op %d: %v", op, err)
						}
					}
				case x < 85:
					if err := c.Put(k, cachetest.Page(k, uint32(op)), 0); err != nil {
						t.Fatal(err)
					}
				case x < 92:
					_ = c.Invalidate(k)
				case x < 95:
					_ = c.InvalidateRel(k.Tag(), uint32(r.IntN(60)))
				default:
					if err := c.Resize(int64(r.IntN(80)) * pg.BlockSize); err != nil {
						t.Fatal(err)
					}
				}
				if err := c.checkInvariants(); err != nil {
					t.Fatalf("op %d: %v", op, err)
				}
				if st := c.Stats(); st.UsedBytes > st.CapacityBytes {
					t.Fatalf("op %d: %+v", op, st)
				}
			}
		})
	}
}
