package walstore

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"

	"github.com/stratadb/strata/sdk/pg"
)

// ControlFileName is the name of the control file inside the data folder.
const ControlFileName = "safekeeper.control"

const controlMagic = "STRATASK"

// TermStart records that term Term began writing WAL at LSN Start. A term
// history is ordered by Term and by Start.
type TermStart struct {
	Term  uint64 `json:"term"`
	Start pg.LSN `json:"start"`
}

// Control is the durable state of a safekeeper besides its WAL bytes. It is
// written as a whole, atomically (temporary file, fsync, rename, fsync of the
// folder), with a CRC-32C over its bytes.
type Control struct {
	// SystemID is the Postgres system identifier of the cluster whose WAL this
	// safekeeper holds (0 until the first connection).
	SystemID uint64 `json:"system_id"`
	// Timeline is Postgres' WAL timeline number, used to name segments.
	Timeline pg.PGTimeline `json:"timeline"`
	// Term is the highest term this safekeeper has voted in.
	Term uint64 `json:"term"`
	// ComputeID names the compute that owns Term.
	ComputeID string `json:"compute_id"`
	// Accepted: the Accept of Term was applied; the safekeeper follows
	// ComputeID's Postgres.
	Accepted bool `json:"accepted"`
	// ComputePostgres is host:port of the followed Postgres ("" means the
	// configured one).
	ComputePostgres string `json:"compute_postgres"`
	// TermHistory lists where each accepted term's WAL begins.
	TermHistory []TermStart `json:"term_history"`
	// StartLSN is the first LSN held locally (WAL below it was removed or
	// never received).
	StartLSN pg.LSN `json:"start_lsn"`
	// FlushLSN is a lower bound of the durable end of local WAL: at open the
	// store verifies the WAL up to it and then extends it with every block
	// whose checksum proves it durable.
	FlushLSN pg.LSN `json:"flush_lsn"`
	// Truncating is set while a truncation to FlushLSN is under way: the
	// checksum entries past FlushLSN are stale and must not extend it.
	Truncating bool `json:"truncating,omitempty"`
	// CommitLSN is the highest LSN known to be held by a quorum.
	CommitLSN pg.LSN `json:"commit_lsn"`
	// ArchivedLSN: all WAL below it is in the object store.
	ArchivedLSN pg.LSN `json:"archived_lsn"`
	// ConsumerDurableLSN: the pageserver made all WAL below it durable.
	ConsumerDurableLSN pg.LSN `json:"consumer_durable_lsn"`
}

// LastTerm returns the term of the last entry of the term history (0 when
// empty).
func (c *Control) LastTerm() uint64 {
	if len(c.TermHistory) == 0 {
		return 0
	}
	return c.TermHistory[len(c.TermHistory)-1].Term
}

func (c *Control) clone() Control {
	d := *c
	d.TermHistory = append([]TermStart(nil), c.TermHistory...)
	return d
}

// encodeControl lays out: magic (8) | length (4, big endian) | JSON | CRC-32C
// of everything before it (4).
func encodeControl(c *Control) ([]byte, error) {
	body, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(body)+16)
	b = append(b, controlMagic...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	b = append(b, body...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

func decodeControl(b []byte) (Control, error) {
	var c Control
	if len(b) < 16 || string(b[:8]) != controlMagic {
		return c, fmt.Errorf("%w: control file: bad magic or too short (%d bytes)", ErrCorrupt, len(b))
	}
	n := int(binary.BigEndian.Uint32(b[8:12]))
	if len(b) != 16+n {
		return c, fmt.Errorf("%w: control file: length %d does not match body %d", ErrCorrupt, len(b), n)
	}
	want := binary.BigEndian.Uint32(b[12+n:])
	if got := crc32.Checksum(b[:12+n], castagnoli); got != want {
		return c, fmt.Errorf("%w: control file: checksum %08x, stored %08x", ErrCorrupt, got, want)
	}
	if err := json.Unmarshal(b[12:12+n], &c); err != nil {
		return c, fmt.Errorf("%w: control file: %v", ErrCorrupt, err)
	}
	return c, nil
}

// readControl loads the control file; ok is false when there is none.
func readControl(dir string) (c Control, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, ControlFileName))
	if errors.Is(err, os.ErrNotExist) {
		return c, false, nil
	}
	if err != nil {
		return c, false, fmt.Errorf("walstore: %w", err)
	}
	c, err = decodeControl(b)
	if err != nil {
		return c, false, fmt.Errorf("%w (%s)", err, filepath.Join(dir, ControlFileName))
	}
	return c, true, nil
}

// writeControl replaces the control file atomically and durably.
func writeControl(dir string, c *Control, nosync bool) error {
	b, err := encodeControl(c)
	if err != nil {
		return fmt.Errorf("walstore: encode control: %w", err)
	}
	tmp := filepath.Join(dir, ControlFileName+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("walstore: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("walstore: write control: %w", err)
	}
	if !nosync {
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("walstore: sync control: %w", err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("walstore: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, ControlFileName)); err != nil {
		return fmt.Errorf("walstore: %w", err)
	}
	if nosync {
		return nil
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("walstore: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("walstore: sync %s: %w", dir, err)
	}
	return nil
}
