package timeline

import (
	"container/list"
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/sdk/pg"
)

// pageCache keeps the newest materialized value of hot keys. An entry is
// the value of the key's newest version (at lsn), so it answers any read at
// or above lsn; writes to the key delete the entry. Bounded by bytes, LRU.
//
// It is split into up to maxCacheShards shards by key (one per MiB of
// budget), each with its own lock, LRU list and share of the byte budget,
// so that concurrent GetPage calls on different pages do not queue on one
// mutex.
type pageCache struct {
	shards []cacheShard
}

const maxCacheShards = 16

type cacheShard struct {
	mu    sync.Mutex
	max   int64
	used  int64
	ll    *list.List
	items map[keyspace.Key]*list.Element
	_     [40]byte // keep shards on separate cache lines
}

type cacheEntry struct {
	key  keyspace.Key
	lsn  pg.LSN
	data []byte // nil: the key does not exist (tombstone)
}

func newPageCache(max int64) *pageCache {
	n := int64(1)
	for n < maxCacheShards && max/(2*n) >= 1<<20 {
		n *= 2
	}
	c := &pageCache{shards: make([]cacheShard, n)}
	for i := range c.shards {
		c.shards[i] = cacheShard{max: max / n, ll: list.New(), items: map[keyspace.Key]*list.Element{}}
	}
	return c
}

// shard picks a key's shard from its block number and relation, so that
// neighbouring blocks spread over the shards.
func (c *pageCache) shard(k keyspace.Key) *cacheShard {
	h := binary.BigEndian.Uint32(k[14:]) ^ binary.BigEndian.Uint32(k[9:])*0x9E3779B1 ^ uint32(k[0])
	return &c.shards[h%uint32(len(c.shards))]
}

// get returns the cached value if it answers a read at upto: the value,
// whether the key exists, and whether the cache answered.
func (c *pageCache) get(k keyspace.Key, upto pg.LSN) ([]byte, bool, bool) {
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.items[k]
	if !ok {
		return nil, false, false
	}
	e := el.Value.(*cacheEntry)
	if e.lsn > upto {
		return nil, false, false
	}
	s.ll.MoveToFront(el)
	return e.data, e.data != nil, true
}

// putIf stores the value of k's newest version (at lsn) unless the
// timeline's write epoch moved since the reader loaded want (before it
// collected the versions). Writers bump the epoch before they insert
// versions and again after they invalidated the keys' entries; the check
// and the insert happen under the shard lock, which the invalidation also
// takes, so a stale value never survives the write that made it stale.
func (c *pageCache) putIf(k keyspace.Key, lsn pg.LSN, data []byte, epoch *atomic.Uint64, want uint64) {
	s := c.shard(k)
	if s.max <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if epoch.Load() != want {
		return
	}
	if el, ok := s.items[k]; ok {
		s.removeLocked(el)
	}
	e := &cacheEntry{key: k, lsn: lsn, data: data}
	s.items[k] = s.ll.PushFront(e)
	s.used += int64(len(data)) + 64
	for s.used > s.max && s.ll.Len() > 0 {
		s.removeLocked(s.ll.Back())
	}
}

func (s *cacheShard) removeLocked(el *list.Element) {
	e := el.Value.(*cacheEntry)
	s.ll.Remove(el)
	delete(s.items, e.key)
	s.used -= int64(len(e.data)) + 64
}

// invalidate drops the entry of k.
func (c *pageCache) invalidate(k keyspace.Key) {
	s := c.shard(k)
	s.mu.Lock()
	if el, ok := s.items[k]; ok {
		s.removeLocked(el)
	}
	s.mu.Unlock()
}

// invalidateBatch drops the entries of the keys of cs.
func (c *pageCache) invalidateBatch(cs []Change) {
	for i := range cs {
		s := c.shard(cs[i].Key)
		s.mu.Lock()
		if len(s.items) > 0 {
			if el, ok := s.items[cs[i].Key]; ok {
				s.removeLocked(el)
			}
		}
		s.mu.Unlock()
	}
}
