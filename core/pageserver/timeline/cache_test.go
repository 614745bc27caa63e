package timeline

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// TestCacheNeverStale races readers at the latest LSN against a writer
// that keeps overwriting a few keys: a read that starts after a write
// returned must see that write or a later one, whatever the page cache
// holds. Run it with -race.
func TestCacheNeverStale(t *testing.T) {
	commit := &CommitLSN{}
	commit.Set(1 << 60)
	o := smallOpts()
	o.CacheBytes = 1 << 20
	tl, err := Open(context.Background(), pg.TimelineID{0xCA}, t.TempDir(), o, Deps{Log: zerolog.Nop(), Commit: commit})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	ctx := context.Background()
	const keys = 4
	key := func(i int) keyspace.Key {
		return keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 9, Block: uint32(i)})
	}
	var published [keys]atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := (i + r) % keys
				want := published[k].Load()
				if want == 0 {
					continue
				}
				d, err := tl.Get(ctx, key(k), LatestLSN)
				if err != nil {
					errs <- err
					return
				}
				if got := binary.BigEndian.Uint64(d); got < want {
					errs <- fmt.Errorf("key %d: read version %d after version %d was written", k, got, want)
					return
				}
			}
		}(r)
	}
	deadline := time.Now().Add(time.Second)
	lsn := pg.LSN(100)
	for v := uint64(1); time.Now().Before(deadline); v++ {
		k := int(v % keys)
		d := make([]byte, 64)
		binary.BigEndian.PutUint64(d, v)
		lsn += 8
		if err := tl.IngestBuffered(ctx, []Change{{Key: key(k), LSN: lsn, Kind: layer.Image, Data: d}}, lsn); err != nil {
			t.Fatal(err)
		}
		published[k].Store(v)
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestIngestBufferedDurable checks what LSNs().Durable says around
// IngestBuffered, SyncIngested and a synced Ingest, and that a reopened
// timeline has every version SyncIngested covered.
func TestIngestBufferedDurable(t *testing.T) {
	commit := &CommitLSN{}
	dir := t.TempDir()
	open := func() *Timeline {
		tl, err := Open(context.Background(), pg.TimelineID{0xDB}, dir, smallOpts(), Deps{Log: zerolog.Nop(), Commit: commit})
		if err != nil {
			t.Fatal(err)
		}
		return tl
	}
	tl := open()
	ctx := context.Background()
	k := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 2, Block: 3})
	put := func(lsn pg.LSN, buffered bool) {
		t.Helper()
		cs := []Change{{Key: k, LSN: lsn, Kind: layer.Image, Data: []byte(lsn.String())}}
		var err error
		if buffered {
			err = tl.IngestBuffered(ctx, cs, lsn)
		} else {
			err = tl.Ingest(ctx, cs, lsn)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	put(100, false)
	put(200, true)
	put(300, true)
	if l := tl.LSNs(); l.LastRecord != 300 || l.Durable != 100 {
		t.Fatalf("after buffered ingest: last %s durable %s, want 0/12C and 0/64", l.LastRecord, l.Durable)
	}
	if d, err := tl.Get(ctx, k, LatestLSN); err != nil || string(d) != pg.LSN(300).String() {
		t.Fatalf("buffered version not visible: %q %v", d, err)
	}
	if err := tl.SyncIngested(); err != nil {
		t.Fatal(err)
	}
	if l := tl.LSNs(); l.Durable != 300 {
		t.Fatalf("after SyncIngested: durable %s", l.Durable)
	}
	put(400, true)
	put(500, false) // a synced Ingest covers the buffered one before it
	if l := tl.LSNs(); l.Durable != 500 {
		t.Fatalf("after a synced Ingest: durable %s", l.Durable)
	}
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
	tl = open()
	defer tl.Close()
	if d, err := tl.Get(ctx, k, 400); err != nil || string(d) != pg.LSN(400).String() {
		t.Fatalf("after reopen, version at 0/190: %q %v", d, err)
	}
	// Buffered ingest after a restart: the durable LSN does not go back.
	put(600, true)
	if l := tl.LSNs(); l.Durable != 500 || l.LastRecord != 600 {
		t.Fatalf("after reopen and a buffered ingest: durable %s, last %s; want 0/1F4, 0/258", l.Durable, l.LastRecord)
	}
}
