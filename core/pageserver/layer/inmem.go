package layer

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/internal/pacedwrite"
	"github.com/stratadb/strata/sdk/pg"
)

// InMem is the in-memory layer: every version put into it is appended to a
// log file (so that it survives a restart once Sync returns) and indexed in
// memory by key. When it is large or old enough the timeline freezes it and
// writes it out as delta layer files (WriteDeltas), then Removes it.
//
// Log record: len[4] crc32c[4] then key[18] lsn[8] seq[8] kind[1] data
// (len counts the bytes after the crc). Every PutBatch ends with a marker
// record (kind 0, seq = the batch's count); on Open a torn or corrupt tail
// is cut off at the first bad record, together with the versions of a
// batch whose marker is missing.
//
// Concurrency: all methods are safe for concurrent use. Two locks keep
// readers off the disk's latency: logMu serializes the log (appends, Sync,
// Freeze), mu guards the in-memory index and is held only while versions
// are inserted, never across a write or fsync of the log.
type InMem struct {
	path string

	logMu sync.Mutex // guards f, w, the log's offsets and frozen transitions
	f     *os.File
	w     *bufio.Writer
	// The log's durable prefix and what was appended since (see repair):
	// synced is the offset the last successful Sync (or Open) made
	// durable, off the offset after the last record handed to w, unsynced
	// the batches appended since synced, and broken the error that left
	// the log behind the index (a full disk), nil when it is not.
	synced   int64
	off      int64
	unsynced [][]Version
	broken   error

	mu      sync.RWMutex
	data    [][]byte               // chunks holding the versions' Data (from chunkPool); written under logMu, released under both
	removed bool                   // Remove returned the chunks: reads fail with ErrClosed
	vers    chunked                // every version, in arrival order
	heads   map[keyspace.Key]int32 // newest version of each key
	bytes   int64
	lsnMin  pg.LSN
	lsnMax  pg.LSN
	maxSeq  uint64
	created time.Time
	frozen  bool
}

const logHeader = 8
const logFixed = keyspace.KeySize + 8 + 8 + 1

// OpenInMem opens (or creates) the in-memory layer backed by the log at
// path, replaying what the log holds.
func OpenInMem(path string, now time.Time) (*InMem, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	m := &InMem{path: path, f: f, heads: make(map[keyspace.Key]int32), created: now, lsnMin: ^pg.LSN(0)}
	good, err := m.replay()
	if err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Truncate(good); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(good, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	m.w = bufio.NewWriterSize(f, 256<<10)
	m.synced, m.off = good, good
	return m, nil
}

// batchEnd is the kind of the marker record PutBatch appends after a
// batch: replay applies a batch only when its marker made it to the log,
// so a crash in the middle of a batch loses the whole batch, never part of
// it (a WAL record's block changes, or the pages of one PutPages, are all
// there or all absent). A log without any marker (written before markers
// existed) is replayed record by record, as then.
const batchEnd Kind = 0

func (m *InMem) replay() (int64, error) {
	r := bufio.NewReaderSize(m.f, 256<<10)
	var off, committed int64
	var hdr [logHeader]byte
	var pend []Version
	markers := false
	end := func() (int64, error) {
		if markers {
			return committed, nil // drop a batch without its marker
		}
		for _, v := range pend {
			m.insert(v)
		}
		return off, nil
	}
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return end() // clean end or torn header
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n < logFixed || n > 64<<20 {
			return end()
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return end()
		}
		if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(hdr[4:]) {
			return end()
		}
		off += logHeader + int64(n)
		var v Version
		copy(v.Key[:], body)
		p := keyspace.KeySize
		v.LSN = pg.LSN(binary.BigEndian.Uint64(body[p:]))
		v.Seq = binary.BigEndian.Uint64(body[p+8:])
		v.Kind = Kind(body[p+16])
		if v.Kind == batchEnd {
			markers = true
			for _, pv := range pend {
				m.insert(pv)
			}
			pend = pend[:0]
			committed = off
			continue
		}
		v.Data = m.keep(body[logFixed:])
		pend = append(pend, v)
	}
}

// Path returns the log file's path.
func (m *InMem) Path() string { return m.path }

// Put appends v to the log (buffered: durable after Sync) and indexes it.
// v.Data must not be modified afterwards.
func (m *InMem) Put(v Version) error {
	return m.PutBatch([]Version{v})
}

// PutBatch is Put for many versions: they are appended to the log, then
// indexed together (readers see all of them or none).
func (m *InMem) PutBatch(vs []Version) error {
	if len(vs) == 0 {
		return nil
	}
	m.logMu.Lock()
	defer m.logMu.Unlock()
	// frozen only changes under logMu (Freeze), so it is stable here.
	if m.frozen {
		return ErrFrozen
	}
	if m.w == nil {
		return ErrClosed
	}
	if m.broken != nil {
		if err := m.repair(); err != nil {
			return err
		}
	}
	if err := m.appendBatch(vs); err != nil {
		m.broken = err
		return err
	}
	// Copy the data before taking the index lock: readers wait only for
	// the inserts.
	batch := make([]Version, len(vs))
	for i, v := range vs {
		v.Data = m.keep(v.Data)
		batch[i] = v
	}
	m.unsynced = append(m.unsynced, batch)
	m.mu.Lock()
	for _, v := range batch {
		m.insert(v)
	}
	m.mu.Unlock()
	return nil
}

// appendBatch appends vs and the batch's marker to the log. REQUIRES:
// m.logMu held.
func (m *InMem) appendBatch(vs []Version) error {
	for i := range vs {
		if err := m.appendLog(&vs[i]); err != nil {
			return err
		}
	}
	return m.appendLog(&Version{Kind: batchEnd, Seq: uint64(len(vs))})
}

// repair brings a broken log (a write or fsync failed: a full disk) back
// in line with the index: it cuts the log at its durable prefix, appends
// every batch put since, and syncs. Until it succeeds the layer's batches
// since the last Sync are readable but not durable, and every PutBatch and
// Sync tries it again (and fails with the error of the attempt), so the
// layer takes writes again once space is freed. REQUIRES: m.logMu held.
func (m *InMem) repair() error {
	first := m.broken
	fail := func(err error) error {
		m.broken = err
		return fmt.Errorf("layer: log %s cannot catch up after %v: %w", m.path, first, err)
	}
	if err := m.f.Truncate(m.synced); err != nil {
		return fail(err)
	}
	if _, err := m.f.Seek(m.synced, io.SeekStart); err != nil {
		return fail(err)
	}
	m.w.Reset(m.f)
	m.off = m.synced
	for _, b := range m.unsynced {
		if err := m.appendBatch(b); err != nil {
			return fail(err)
		}
	}
	if err := m.w.Flush(); err != nil {
		return fail(err)
	}
	if err := m.f.Sync(); err != nil {
		return fail(err)
	}
	m.broken = nil
	m.synced, m.unsynced = m.off, m.unsynced[:0]
	return nil
}

// keep copies d into the layer's chunks. REQUIRES: m.logMu held (or no
// concurrency yet).
func (m *InMem) keep(d []byte) []byte {
	if len(d) == 0 {
		return d[:0:0]
	}
	if len(d) > dataChunk/4 {
		return append([]byte(nil), d...)
	}
	if n := len(m.data); n == 0 || cap(m.data[n-1])-len(m.data[n-1]) < len(d) {
		m.data = append(m.data, chunkPool.get())
	}
	c := &m.data[len(m.data)-1]
	off := len(*c)
	*c = append(*c, d...)
	return (*c)[off : off+len(d) : off+len(d)]
}

// chunkPool recycles the memory in-memory layers copy version data into.
// Ingest writes hundreds of megabytes through short-lived in-memory
// layers; allocating that afresh each time made the kernel fault in every
// page again (here about 150 MB/s, the ceiling of WAL ingest), while
// recycled chunks are already mapped. It keeps at most maxFreeChunks.
var chunkPool = &chunks{}

const (
	dataChunk     = 1 << 20
	maxFreeChunks = 256
)

type chunks struct {
	mu   sync.Mutex
	free [][]byte
}

func (p *chunks) get() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.free); n > 0 {
		c := p.free[n-1]
		p.free = p.free[:n-1]
		return c[:0]
	}
	return make([]byte, 0, dataChunk)
}

func (p *chunks) put(cs [][]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		if len(p.free) >= maxFreeChunks {
			return
		}
		p.free = append(p.free, c[:0])
	}
}

// appendLog writes one log record. REQUIRES: m.logMu held.
func (m *InMem) appendLog(v *Version) error {
	var hdr [logHeader + logFixed]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(logFixed+len(v.Data)))
	b := hdr[logHeader:]
	copy(b, v.Key[:])
	p := keyspace.KeySize
	binary.BigEndian.PutUint64(b[p:], uint64(v.LSN))
	binary.BigEndian.PutUint64(b[p+8:], v.Seq)
	b[p+16] = byte(v.Kind)
	c := crc32.Update(crc32.Checksum(b, castagnoli), castagnoli, v.Data)
	binary.BigEndian.PutUint32(hdr[4:], c)
	if _, err := m.w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := m.w.Write(v.Data); err != nil {
		return err
	}
	m.off += int64(len(hdr) + len(v.Data))
	return nil
}

func (m *InMem) insert(v Version) {
	h, ok := m.heads[v.Key]
	if !ok || v.Newer(&m.vers.at(h).v) { // the common case: a new newest version
		older := int32(-1)
		if ok {
			older = h
		}
		m.heads[v.Key] = m.vers.add(v, older)
		m.account(v)
		return
	}
	// Walk the chain to the first version v is newer than.
	prev := int32(-1)
	for cur := h; cur >= 0; cur = m.vers.at(cur).older {
		c := &m.vers.at(cur).v
		if c.LSN == v.LSN && c.Seq == v.Seq {
			return // replayed duplicate
		}
		if v.Newer(c) {
			break
		}
		prev = cur
	}
	p := m.vers.at(prev)
	p.older = m.vers.add(v, p.older)
	m.account(v)
}

// chunked is an append-only array of versions in fixed-size chunks (no
// copying as it grows), each with the index of its key's next older version.
type chunked struct {
	chunks [][]node
	n      int32
}

type node struct {
	v     Version
	older int32
}

const chunkSize = 4096

func (c *chunked) add(v Version, older int32) int32 {
	if int(c.n)%chunkSize == 0 {
		c.chunks = append(c.chunks, make([]node, 0, chunkSize))
	}
	last := &c.chunks[len(c.chunks)-1]
	*last = append(*last, node{v: v, older: older})
	c.n++
	return c.n - 1
}

func (c *chunked) at(i int32) *node { return &c.chunks[i/chunkSize][i%chunkSize] }

func (m *InMem) account(v Version) {
	m.bytes += int64(len(v.Data)) + logFixed + logHeader
	m.lsnMin = min(m.lsnMin, v.LSN)
	m.lsnMax = max(m.lsnMax, v.LSN)
	m.maxSeq = max(m.maxSeq, v.Seq)
}

// Sync flushes the log buffer and fsyncs the log file. Readers are not
// blocked while it waits for the disk.
func (m *InMem) Sync() error {
	m.logMu.Lock()
	defer m.logMu.Unlock()
	if m.w == nil {
		return nil
	}
	if m.broken != nil {
		return m.repair()
	}
	if err := m.w.Flush(); err != nil {
		m.broken = err
		return err
	}
	if err := m.f.Sync(); err != nil {
		m.broken = err
		return err
	}
	m.synced, m.unsynced = m.off, m.unsynced[:0]
	return nil
}

// Freeze makes the layer read-only: later Puts fail with ErrFrozen.
func (m *InMem) Freeze() error {
	m.logMu.Lock()
	m.mu.Lock()
	m.frozen = true
	m.mu.Unlock()
	m.logMu.Unlock()
	return m.Sync()
}

// Versions appends to out the versions of k with LSN <= upto, oldest first.
// The Data slices are shared: callers must not modify them, nor use them
// after Remove (readers use ReadVersions).
func (m *InMem) Versions(out []Version, k keyspace.Key, upto pg.LSN) []Version {
	m.mu.RLock()
	defer m.mu.RUnlock()
	h, ok := m.heads[k]
	if !ok {
		return out
	}
	n := len(out)
	for cur := h; cur >= 0; {
		nd := m.vers.at(cur)
		if nd.v.LSN <= upto {
			out = append(out, nd.v)
		}
		cur = nd.older
	}
	slices.Reverse(out[n:])
	return out
}

// ReadVersions appends to out what a read of k at upto needs from this
// layer: the versions with LSN <= upto from the newest base version
// (image, will_init, tombstone) on, or all of them when none is a base,
// oldest first. Unlike Versions its cost does not grow with the key's
// older history, and the Data slices are copies that the caller owns. It
// fails with ErrClosed once the layer was removed (its versions are in
// layer files by then: read those).
func (m *InMem) ReadVersions(out []Version, k keyspace.Key, upto pg.LSN) ([]Version, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.removed {
		return out, ErrClosed
	}
	h, ok := m.heads[k]
	if !ok {
		return out, nil
	}
	n := len(out)
	for cur := h; cur >= 0; {
		nd := m.vers.at(cur)
		if nd.v.LSN <= upto {
			v := nd.v
			v.Data = append([]byte(nil), v.Data...)
			out = append(out, v)
			if nd.v.Kind.IsBase() {
				break
			}
		}
		cur = nd.older
	}
	slices.Reverse(out[n:])
	return out, nil
}

// Keys calls fn for every key in r that has a version at or below upto,
// in no particular order.
func (m *InMem) Keys(r keyspace.Range, upto pg.LSN, fn func(keyspace.Key)) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for k, h := range m.heads {
		if !r.Contains(k) {
			continue
		}
		for cur := h; cur >= 0; cur = m.vers.at(cur).older {
			if m.vers.at(cur).v.LSN <= upto {
				fn(k)
				break
			}
		}
	}
}

// Stats returns the log size in bytes, the number of keys, the LSN range
// of its versions (lsnMin > lsnMax when empty), the highest Seq and the
// creation time.
func (m *InMem) Stats() (bytes int64, keys int, lsnMin, lsnMax pg.LSN, maxSeq uint64, created time.Time) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.bytes, len(m.heads), m.lsnMin, m.lsnMax, m.maxSeq, m.created
}

// Empty reports whether the layer holds no versions.
func (m *InMem) Empty() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.heads) == 0
}

// Sorted returns every version in (Key, LSN, Seq) order. REQUIRES: frozen.
// The Data slices are shared and valid until Remove.
func (m *InMem) Sorted() []Version {
	m.mu.RLock()
	defer m.mu.RUnlock()
	keys := make([]keyspace.Key, 0, len(m.heads))
	for k := range m.heads {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Less(keys[j]) })
	out := make([]Version, 0, m.vers.n)
	for _, k := range keys {
		n := len(out)
		for cur := m.heads[k]; cur >= 0; cur = m.vers.at(cur).older {
			out = append(out, m.vers.at(cur).v)
		}
		slices.Reverse(out[n:])
	}
	return out
}

// Close closes the log file (without removing it).
func (m *InMem) Close() error {
	m.logMu.Lock()
	defer m.logMu.Unlock()
	if m.f == nil {
		return nil
	}
	err := m.w.Flush()
	err = errors.Join(err, m.f.Close())
	m.f, m.w = nil, nil
	return err
}

// Release returns the layer's memory for reuse by other in-memory
// layers: reads fail with ErrClosed afterwards. The timeline calls it for
// layers it will not read again (closed at shutdown; Remove does it too).
func (m *InMem) Release() {
	m.logMu.Lock()
	defer m.logMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.removed {
		m.removed = true
		chunkPool.put(m.data)
		m.data = nil
	}
}

// Remove closes and deletes the log file. Call it once the layer's
// contents are durable elsewhere (in flushed layer files).
func (m *InMem) Remove() error {
	err := m.Close()
	m.Release()
	if rerr := os.Remove(m.path); rerr != nil && !os.IsNotExist(rerr) {
		err = errors.Join(err, rerr)
	}
	return err
}

// WriteFiles writes versions (sorted by Key, LSN, Seq) into one or more
// layer files of the given kind under dir, starting a new file at a key
// boundary whenever a file reaches targetSize bytes. Each file covers
// exactly the key range of its versions (not the whole key space), which
// is what keeps reads from having to consult every flushed layer. lsnStart
// and lsnEnd give the LSN range of every file (0, 0: each file's own).
// The files are fsynced; their Descs are returned in key order.
func WriteFiles(dir string, kind FileKind, versions []Version, targetSize int64, lsnStart, lsnEnd pg.LSN) ([]Desc, error) {
	var out []Desc
	for i := 0; i < len(versions); {
		j := i
		var size int64
		for j < len(versions) && (size < targetSize || versions[j].Key == versions[j-1].Key) {
			size += int64(len(versions[j].Data)) + entrySize
			j++
		}
		d, err := WriteFile(dir, kind, versions[i:j], keyspace.Range{}, lsnStart, lsnEnd)
		if err != nil {
			return out, err
		}
		out = append(out, d)
		i = j
	}
	return out, nil
}

// WriteFile writes vs (sorted by Key, LSN, Seq) into one fsynced layer file
// under dir, named by NewName. keys is the file's declared key range (zero:
// exactly the keys of vs); lsnStart/lsnEnd as for Writer.Finish.
func WriteFile(dir string, kind FileKind, vs []Version, keys keyspace.Range, lsnStart, lsnEnd pg.LSN) (Desc, error) {
	tmp, err := os.CreateTemp(dir, "tmp-layer-*")
	if err != nil {
		return Desc{}, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	w := NewWriter(pacedwrite.New(tmp), kind)
	for i := range vs {
		if err := w.Add(&vs[i]); err != nil {
			return Desc{}, err
		}
	}
	d, err := w.Finish(keys, lsnStart, lsnEnd)
	if err != nil {
		return Desc{}, err
	}
	if err := tmp.Sync(); err != nil {
		return Desc{}, err
	}
	d.Name = NewName(kind, d.Keys, d.LSNStart, d.LSNEnd)
	if err := os.Rename(tmp.Name(), dir+"/"+d.Name); err != nil {
		return Desc{}, fmt.Errorf("layer: %w", err)
	}
	return d, syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
