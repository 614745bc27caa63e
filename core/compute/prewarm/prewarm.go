// Package prewarm keeps the list of pages a compute's LFC holds in the
// object store, so that the next compute of the timeline (a restart, or a
// new machine) can read those pages into its own LFC right after it starts
// instead of one miss at a time.
//
// A list is one immutable object under Prefix(timeline), named by the time
// it was saved; Save writes a new one and then deletes the others, Load
// reads the newest. The encoding is runs of consecutive blocks of one
// relation fork with a CRC-32C over the whole object, so a list of a few
// large tables stays a few hundred bytes and a damaged one is refused, not
// half used.
package prewarm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// ErrCorrupt: a list object does not decode (wrong magic, bad length, CRC
// mismatch).
var ErrCorrupt = errors.New("prewarm: corrupt page list")

// ErrNone: no list was saved for the timeline.
var ErrNone = errors.New("prewarm: no page list saved")

const (
	magic   = "STRATA-PREWARM-1"
	runSize = 4*3 + 1 + 4 + 4 // spc, db, rel, fork, first block, count
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Prefix is where the lists of a timeline live.
func Prefix(tl pg.TimelineID) string { return "prewarm/" + tl.String() + "/" }

// Encode returns the list object of keys (any order, duplicates allowed).
func Encode(keys []pg.PageKey) []byte {
	keys = slices.Clone(keys)
	slices.SortFunc(keys, comparePageKeys)
	keys = slices.Compact(keys)
	var runs bytes.Buffer
	n := 0
	for i := 0; i < len(keys); {
		j := i + 1
		for j < len(keys) && keys[j].Tag() == keys[i].Tag() && keys[j].Block == keys[j-1].Block+1 {
			j++
		}
		k := keys[i]
		var b [runSize]byte
		binary.BigEndian.PutUint32(b[0:], k.Spc)
		binary.BigEndian.PutUint32(b[4:], k.DB)
		binary.BigEndian.PutUint32(b[8:], k.Rel)
		b[12] = byte(k.Fork)
		binary.BigEndian.PutUint32(b[13:], k.Block)
		binary.BigEndian.PutUint32(b[17:], uint32(j-i))
		runs.Write(b[:])
		n++
		i = j
	}
	out := make([]byte, 0, len(magic)+8+runs.Len()+4)
	out = append(out, magic...)
	out = binary.BigEndian.AppendUint32(out, uint32(n))
	out = binary.BigEndian.AppendUint32(out, uint32(len(keys)))
	out = append(out, runs.Bytes()...)
	return binary.BigEndian.AppendUint32(out, crc32.Checksum(out, castagnoli))
}

// Decode returns the keys of a list object, in relation and block order.
func Decode(data []byte) ([]pg.PageKey, error) {
	if len(data) < len(magic)+12 || string(data[:len(magic)]) != magic {
		return nil, fmt.Errorf("%w: not a page list (%d bytes)", ErrCorrupt, len(data))
	}
	body, sum := data[:len(data)-4], binary.BigEndian.Uint32(data[len(data)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return nil, fmt.Errorf("%w: CRC-32C %08x, stored %08x", ErrCorrupt, got, sum)
	}
	p := body[len(magic):]
	nRuns, nKeys := binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:])
	p = p[8:]
	if uint64(len(p)) != uint64(nRuns)*runSize {
		return nil, fmt.Errorf("%w: %d runs in %d bytes", ErrCorrupt, nRuns, len(p))
	}
	keys := make([]pg.PageKey, 0, min(nKeys, 1<<24))
	for ; len(p) > 0; p = p[runSize:] {
		k := pg.PageKey{Spc: binary.BigEndian.Uint32(p), DB: binary.BigEndian.Uint32(p[4:]),
			Rel: binary.BigEndian.Uint32(p[8:]), Fork: pg.ForkNumber(p[12]), Block: binary.BigEndian.Uint32(p[13:])}
		count := binary.BigEndian.Uint32(p[17:])
		if count == 0 || uint64(k.Block)+uint64(count) > 1<<32 {
			return nil, fmt.Errorf("%w: run of %d blocks from %s", ErrCorrupt, count, k)
		}
		for i := uint32(0); i < count; i++ {
			keys = append(keys, k.Tag().Page(k.Block+i))
		}
	}
	if uint32(len(keys)) != nKeys {
		return nil, fmt.Errorf("%w: %d pages in the runs, header says %d", ErrCorrupt, len(keys), nKeys)
	}
	return keys, nil
}

// Sum is a digest of keys that does not depend on their order or
// duplicates: equal sums mean, with near certainty, the same list.
func Sum(keys []pg.PageKey) uint64 {
	h := fnv.New64a()
	h.Write(Encode(keys))
	return h.Sum64()
}

func comparePageKeys(a, b pg.PageKey) int {
	for _, d := range [...]int{cmp32(a.Spc, b.Spc), cmp32(a.DB, b.DB), cmp32(a.Rel, b.Rel), cmp32(uint32(a.Fork), uint32(b.Fork)), cmp32(a.Block, b.Block)} {
		if d != 0 {
			return d
		}
	}
	return 0
}

func cmp32(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Save stores keys as the timeline's list and deletes every other one.
// It returns the new object's key.
func Save(ctx context.Context, st objectstore.Store, tl pg.TimelineID, keys []pg.PageKey, now time.Time) (string, error) {
	prefix := Prefix(tl)
	name := prefix + fmt.Sprintf("%020d", now.UnixNano())
	data := Encode(keys)
	// The name is this moment's, to the nanosecond: an object already
	// there is this list, from a retried create whose first attempt
	// landed before its connection failed.
	if err := st.Put(ctx, name, bytes.NewReader(data), objectstore.PutOptions{IfNotExists: true, Size: int64(len(data))}); err != nil && !errors.Is(err, objectstore.ErrExists) {
		return "", fmt.Errorf("prewarm: save %s: %w", name, err)
	}
	old, err := list(ctx, st, prefix)
	if err != nil {
		return name, err
	}
	for _, o := range old {
		// Every other list goes, a "newer" one too: it came from a
		// machine whose clock ran ahead, or it is damaged, and this
		// list is what the compute holds now.
		if o != name {
			if err := st.Delete(ctx, o); err != nil {
				return name, fmt.Errorf("prewarm: delete the older list %s: %w", o, err)
			}
		}
	}
	return name, nil
}

// Load returns the timeline's newest list and its object key: ErrNone when
// there is none, ErrCorrupt (with the key) when the newest does not decode.
func Load(ctx context.Context, st objectstore.Store, tl pg.TimelineID) ([]pg.PageKey, string, error) {
	names, err := list(ctx, st, Prefix(tl))
	if err != nil {
		return nil, "", err
	}
	if len(names) == 0 {
		return nil, "", ErrNone
	}
	name := names[len(names)-1]
	r, err := st.Get(ctx, name)
	if err != nil {
		return nil, name, fmt.Errorf("prewarm: read %s: %w", name, err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, name, fmt.Errorf("prewarm: read %s: %w", name, err)
	}
	keys, err := Decode(data)
	if err != nil {
		return nil, name, fmt.Errorf("%s: %w", name, err)
	}
	return keys, name, nil
}

// list returns the list objects under prefix, oldest first.
func list(ctx context.Context, st objectstore.Store, prefix string) ([]string, error) {
	var names []string
	err := st.List(ctx, prefix, func(o objectstore.ObjectInfo) error {
		if rest := strings.TrimPrefix(o.Key, prefix); len(rest) == 20 && !strings.Contains(rest, "/") {
			names = append(names, o.Key)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("prewarm: list %s: %w", prefix, err)
	}
	slices.Sort(names)
	return names, nil
}
