package pgtest

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/stratadb/strata/internal/pgcontrol"
)

// TemplatesEnv names a folder where Start keeps the output of initdb, one
// per set of initdb arguments, and copies it for each server instead of
// running initdb again; each copy gets a system identifier of its own.
// Test binaries running at once share the folder. scripts/test.sh sets it
// for the run (initdb took about 1.4 CPU-s per server, a tenth of the run);
// without it, Start runs initdb for each server.
const TemplatesEnv = "STRATA_TEST_PG_TEMPLATES"

// initData makes dataDir a fresh cluster of initdb with args (but -D) and
// the superuser's password (none when empty): from a template when
// TemplatesEnv names a folder (a failure there is the test's, not a reason
// to run initdb quietly instead), else by running initdb.
func initData(dataDir string, args []string, password string) error {
	args = args[:len(args):len(args)] // appends below copy
	if root := os.Getenv(TemplatesEnv); root != "" {
		tmpl, err := template(root, args, password)
		if err == nil {
			err = copyTemplate(tmpl, dataDir)
		}
		if err != nil {
			return fmt.Errorf("initdb template in %s=%s: %w", TemplatesEnv, root, err)
		}
		return nil
	}
	if password != "" {
		pw := filepath.Join(filepath.Dir(dataDir), "pwfile")
		if err := writeOwned(pw, password+"\n"); err != nil {
			return err
		}
		args = append(args, "--pwfile", pw)
	}
	return runInitdb(dataDir, args)
}

// writeOwned writes a file for the postgres OS user to read.
func writeOwned(path, text string) error {
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return err
	}
	return Chown(path)
}

func runInitdb(dataDir string, args []string) error {
	cmd, err := Command("initdb", append([]string{"-D", dataDir}, args...)...)
	if err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %v\n%s", err, out)
	}
	return nil
}

// template returns the data folder of the template for args in root,
// making it first if no test binary did. A template is made in a new
// folder and renamed into place, so a reader never sees half of one; two
// makers race harmlessly (the second rename fails, and its copy goes).
func template(root string, args []string, password string) (string, error) {
	key := sha256.New()
	fmt.Fprintf(key, "%s\x00%s\x00%s", BinDir, strings.Join(args, "\x00"), password)
	if fi, err := os.Stat(Bin("postgres")); err == nil {
		fmt.Fprintf(key, "\x00%d\x00%d", fi.Size(), fi.ModTime().UnixNano()) // a new Postgres, a new template
	}
	dir := filepath.Join(root, hex.EncodeToString(key.Sum(nil))[:16])
	data := filepath.Join(dir, "data")
	if _, err := os.Stat(filepath.Join(data, "global", "pg_control")); err == nil {
		return data, nil
	}
	// The postgres OS user must reach the folders initdb writes in.
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(root, "new-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := Chown(tmp); err != nil {
		return "", err
	}
	if password != "" {
		pw := filepath.Join(tmp, "pwfile")
		if err := writeOwned(pw, password+"\n"); err != nil {
			return "", err
		}
		args = append(args, "--pwfile", pw)
	}
	if err := runInitdb(filepath.Join(tmp, "data"), args); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(data, "global", "pg_control")); serr != nil {
			return "", err
		}
	}
	return data, nil
}

// copyTemplate copies the template tmpl to dataDir (which must not exist),
// owners and modes kept, and gives the copy a new system identifier.
func copyTemplate(tmpl, dataDir string) error {
	if out, err := exec.Command("cp", "-a", "--", tmpl, dataDir).CombinedOutput(); err != nil {
		return fmt.Errorf("cp: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return setSystemID(dataDir, newSystemID())
}

var sysIDSeq atomic.Uint64

// newSystemID returns a system identifier made like initdb's (seconds in
// the high half, microseconds below), with this process's sequence in the
// low bits so that two copies made in one microsecond differ.
func newSystemID() uint64 {
	now := time.Now()
	return uint64(now.Unix())<<32 | uint64(now.Nanosecond()/1000)<<12 | (uint64(os.Getpid())+sysIDSeq.Add(1))&0xfff
}

// setSystemID writes id into the cluster's pg_control (its CRC updated)
// and into the long header of each WAL segment in pg_wal, which must hold
// the old identifier: Postgres refuses WAL whose header names another
// system.
func setSystemID(dataDir string, id uint64) error {
	le := binary.LittleEndian
	ctlPath := filepath.Join(dataDir, "global", "pg_control")
	ctl, err := os.ReadFile(ctlPath)
	if err != nil {
		return err
	}
	if err := pgcontrol.Check(ctl); err != nil {
		return fmt.Errorf("%s: %w", ctlPath, err)
	}
	old := le.Uint64(ctl[pgcontrol.SystemIDOffset:])
	segs, err := filepath.Glob(filepath.Join(dataDir, "pg_wal", strings.Repeat("[0-9A-F]", 24)))
	if err != nil {
		return err
	}
	if len(segs) == 0 {
		return errors.New("no WAL segment in pg_wal")
	}
	for _, seg := range segs {
		if err := rewriteSysID(seg, old, id); err != nil {
			return err
		}
	}
	out, err := pgcontrol.Rewrite(ctl, func(b []byte) { le.PutUint64(b[pgcontrol.SystemIDOffset:], id) })
	if err != nil {
		return err
	}
	return os.WriteFile(ctlPath, out, 0o600)
}

// rewriteSysID replaces the system identifier old by id in the long header
// of the WAL segment at path.
func rewriteSysID(path string, old, id uint64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var b [8]byte
	if _, err := f.ReadAt(b[:], pgcontrol.WALSystemIDOffset); err != nil {
		return err
	}
	if got := binary.LittleEndian.Uint64(b[:]); got != old {
		return fmt.Errorf("%s: system identifier %d in the WAL header, %d in pg_control", path, got, old)
	}
	binary.LittleEndian.PutUint64(b[:], id)
	if _, err := f.WriteAt(b[:], pgcontrol.WALSystemIDOffset); err != nil {
		return err
	}
	return f.Close()
}
