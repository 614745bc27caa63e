// Package policy holds the eviction policies of the local file cache: LRU,
// CLOCK and S3-FIFO. A policy orders resident items, named by small integer
// handles that the cache allocates densely from 0, and picks the victim when
// the cache is full. It stores no keys and no data.
//
// Policies are not safe for concurrent use: the cache calls one policy from
// under the lock of the partition that owns it. Every method is O(1)
// amortised, except CLOCK's Victim, which sweeps at most two laps.
package policy

import "fmt"

// Policy orders the resident items of one cache partition.
//
// REQUIRES: Insert is called only for a handle that is not resident; Touch
// and Remove only for resident handles. Handles are >= 0 and small (the
// policy keeps arrays indexed by them).
type Policy interface {
	// Name is the config name of the policy ("lru", "clock", "s3fifo").
	Name() string
	// SetCapacity tells the policy how many items the partition holds when
	// full. S3-FIFO sizes its queues from it; the others ignore it.
	SetCapacity(n int)
	// Insert makes h resident. hash identifies the item's key (S3-FIFO
	// remembers the hashes of recently evicted items).
	Insert(h int32, hash uint64)
	// Touch records a hit on h.
	Touch(h int32)
	// Remove drops h without counting it as an eviction (invalidation).
	Remove(h int32)
	// Victim picks the item to evict, removes it and returns it; false if
	// nothing is resident.
	Victim() (int32, bool)
	// Len is the number of resident items.
	Len() int
}

// Names lists the policies New knows.
var Names = []string{"lru", "clock", "s3fifo"}

// New returns the policy called name.
func New(name string) (Policy, error) {
	switch name {
	case "lru":
		return NewLRU(), nil
	case "clock":
		return NewClock(), nil
	case "s3fifo":
		return NewS3FIFO(), nil
	}
	return nil, fmt.Errorf("policy: unknown policy %q (want one of %v)", name, Names)
}

// list is an intrusive doubly linked list over handles, sharing its link
// arrays with the other lists of the same policy. Items enter at the head
// and leave at the tail.
type links struct {
	prev, next []int32
}

func (l *links) grow(h int32) {
	for int(h) >= len(l.prev) {
		l.prev = append(l.prev, -1)
		l.next = append(l.next, -1)
	}
}

type list struct {
	head, tail int32
	n          int
}

func newList() list { return list{head: -1, tail: -1} }

func (q *list) pushHead(l *links, h int32) {
	l.prev[h] = -1
	l.next[h] = q.head
	if q.head >= 0 {
		l.prev[q.head] = h
	} else {
		q.tail = h
	}
	q.head = h
	q.n++
}

func (q *list) unlink(l *links, h int32) {
	p, n := l.prev[h], l.next[h]
	if p >= 0 {
		l.next[p] = n
	} else {
		q.head = n
	}
	if n >= 0 {
		l.prev[n] = p
	} else {
		q.tail = p
	}
	l.prev[h], l.next[h] = -1, -1
	q.n--
}

func (q *list) popTail(l *links) (int32, bool) {
	h := q.tail
	if h < 0 {
		return -1, false
	}
	q.unlink(l, h)
	return h, true
}
