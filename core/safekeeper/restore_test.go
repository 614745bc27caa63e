package safekeeper

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stratadb/strata/core/safekeeper/internal/testpg"
	"github.com/stratadb/strata/internal/pgtest"
)

// TestRestoreCommandFromSafekeepers: a base backup of the primary, restored
// with restore_command = '<wal fetch> %f %p', replays the WAL written after
// the backup from the safekeepers alone, and has every acknowledged commit.
//
// It takes about a minute, so it runs with STRATA_LONG_TESTS=1.
func TestRestoreCommandFromSafekeepers(t *testing.T) {
	if !longTests() {
		t.Skip("STRATA_LONG_TESTS=1 runs the restore_command test")
	}
	c := startProcCluster(t)
	waitSync(t, c.srv, 3)
	l := startLedger(t, c.srv, 2)
	testpg.WaitFor(t, 30*time.Second, "ledger commits", func() bool { return l.count() > 50 })

	root := pgtest.MkdirOwned(t, "strata-restore-")
	data := filepath.Join(root, "data")
	cmd, err := pgtest.Command("pg_basebackup", "-D", data, "-X", "fetch", "-h", "127.0.0.1", "-p", fmt.Sprint(c.srv.Port), "-U", testpg.ReplUser, "--no-sync")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(cmd.Env, "PGPASSWORD="+testpg.ReplPassword)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	n0 := l.count()
	testpg.WaitFor(t, 60*time.Second, "commits after the backup", func() bool { return l.count() > n0+200 })
	l.stop()
	acked := append([]string(nil), l.acked...)
	end := testpg.FlushLSN(t, c.srv)
	for i := range c.addrs {
		testpg.WaitFor(t, 30*time.Second, "commit LSN", func() bool {
			st, err := c.status(i)
			return err == nil && st.CommitLSN >= end
		})
	}

	port := pgtest.FreePort(t)
	conf := fmt.Sprintf(`port = %d
unix_socket_directories = '%s'
synchronous_standby_names = ''
restore_command = '%s fetch %%f %%p --safekeepers %s'
recovery_target_action = 'promote'
`, port, root, c.bin, strings.Join(c.addrs, ","))
	for name, body := range map[string]string{"postgresql.auto.conf": conf, "recovery.signal": ""} {
		p := filepath.Join(data, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := pgtest.Chown(p); err != nil {
			t.Fatal(err)
		}
	}
	pgc, err := pgtest.Command("postgres", "-D", data)
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(root, "restore.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	pgc.Stdout, pgc.Stderr = logf, logf
	if err := pgc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pgc.Process.Signal(syscall.SIGINT)
		pgc.Wait()
	})
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	var conn *pgx.Conn
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err = pgx.Connect(ctx, url)
		cancel()
		if err == nil {
			var inRecovery bool
			if err = conn.QueryRow(context.Background(), "SELECT pg_is_in_recovery()").Scan(&inRecovery); err == nil && !inRecovery {
				break
			}
			conn.Close(context.Background())
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(root, "restore.log"))
			t.Fatalf("restored server not promoted: %v\n%s", err, tail(string(b), 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	defer conn.Close(context.Background())
	var got int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM ledger WHERE payload = ANY($1)", acked).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != len(acked) {
		b, _ := os.ReadFile(filepath.Join(root, "restore.log"))
		t.Fatalf("restored server has %d of %d acknowledged rows\n%s", got, len(acked), tail(string(b), 30))
	}
	b, _ := os.ReadFile(filepath.Join(root, "restore.log"))
	restored := strings.Count(string(b), "restored log file")
	if restored == 0 {
		t.Fatalf("no WAL restored through restore_command:\n%s", tail(string(b), 30))
	}
	t.Logf("restored server replayed %d segments from the safekeepers and has all %d acknowledged rows (%d after the backup)", restored, len(acked), len(acked)-n0)
}
