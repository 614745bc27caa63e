package timeline

import (
	"container/list"
	"sync"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/sdk/pg"
)

// pageCache keeps the newest materialized value of hot keys. An entry is
// the value of the key's newest version (at lsn), so it answers any read at
// or above lsn; writes to the key delete the entry. Bounded by bytes, LRU.
type pageCache struct {
	mu    sync.Mutex
	max   int64
	used  int64
	ll    *list.List
	items map[keyspace.Key]*list.Element
}

type cacheEntry struct {
	key  keyspace.Key
	lsn  pg.LSN
	data []byte // nil: the key does not exist (tombstone)
}

func newPageCache(max int64) *pageCache {
	return &pageCache{max: max, ll: list.New(), items: map[keyspace.Key]*list.Element{}}
}

// get returns the cached value if it answers a read at upto.
func (c *pageCache) get(k keyspace.Key, upto pg.LSN) ([]byte, bool, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[k]
	if !ok {
		return nil, false, false
	}
	e := el.Value.(*cacheEntry)
	if e.lsn > upto {
		return nil, false, false
	}
	c.ll.MoveToFront(el)
	return e.data, e.data != nil, true
}

func (c *pageCache) put(k keyspace.Key, lsn pg.LSN, data []byte) {
	if c.max <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[k]; ok {
		c.removeLocked(el)
	}
	e := &cacheEntry{key: k, lsn: lsn, data: data}
	c.items[k] = c.ll.PushFront(e)
	c.used += int64(len(data)) + 64
	for c.used > c.max && c.ll.Len() > 0 {
		c.removeLocked(c.ll.Back())
	}
}

func (c *pageCache) invalidate(k keyspace.Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[k]; ok {
		c.removeLocked(el)
	}
}

func (c *pageCache) removeLocked(el *list.Element) {
	e := el.Value.(*cacheEntry)
	c.ll.Remove(el)
	delete(c.items, e.key)
	c.used -= int64(len(e.data)) + 64
}

// invalidateBatch drops the entries of the keys of cs.
func (c *pageCache) invalidateBatch(cs []Change) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.items) == 0 {
		return
	}
	for i := range cs {
		if el, ok := c.items[cs[i].Key]; ok {
			c.removeLocked(el)
		}
	}
}
