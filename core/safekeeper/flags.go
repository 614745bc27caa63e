package safekeeper

import (
	"github.com/spf13/pflag"
)

// BindFlags registers command-line flags for every field of c, with c's
// current values as defaults, so that `strata safekeeper` runs standalone.
func BindFlags(fs *pflag.FlagSet, c *Config) {
	fs.StringVar(&c.ID, "id", c.ID, "safekeeper ID; the application_name listed in synchronous_standby_names")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "data folder (control file, pg_wal/, crc/)")
	fs.StringVar(&c.ListenAddr, "listen", c.ListenAddr, "gRPC listen address (WAL service, election)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr, "Prometheus /metrics address (empty: off)")
	fs.StringVar(&c.Postgres, "postgres", c.Postgres, "connection string of the Postgres to stream from (replication user)")
	fs.StringVar(&c.Slot, "slot", c.Slot, "physical replication slot (default strata_<id>)")
	fs.StringSliceVar(&c.Peers, "peers", c.Peers, "gRPC addresses of the other safekeepers")
	fs.DurationVar(&c.StatusInterval, "status-interval", c.StatusInterval, "longest time between standby status updates")
	fs.DurationVar(&c.ReconnectDelay, "reconnect-delay", c.ReconnectDelay, "pause before reconnecting to Postgres")
	fs.DurationVar(&c.ControlSyncInterval, "control-sync-interval", c.ControlSyncInterval, "how often the control file records the LSNs")
	fs.BoolVar(&c.VerifyOnStart, "verify-on-start", c.VerifyOnStart, "verify every stored block's checksum at start")
	fs.BoolVar(&c.RawSyscalls, "raw-syscalls", c.RawSyscalls, "raw system calls on the WAL path, without the Go runtime's bookkeeping (false: the usual calls)")
	fs.BoolVar(&c.Archive.Enabled, "archive", c.Archive.Enabled, "archive WAL segments to the object store")
	fs.StringVar(&c.Archive.Prefix, "archive-prefix", c.Archive.Prefix, "object key prefix of archived WAL")
	fs.DurationVar(&c.Archive.PartialAfter, "archive-partial-after", c.Archive.PartialAfter, "upload the partial segment after this quiet time (0: never)")
	fs.DurationVar(&c.Archive.PartialEvery, "archive-partial-every", c.Archive.PartialEvery, "also upload the partial segment this often while commits go on (0: only after quiet)")
	fs.DurationVar(&c.Archive.Interval, "archive-interval", c.Archive.Interval, "how often the archiver looks for work")
	fs.BoolVar(&c.Archive.KeepLocal, "archive-keep-local", c.Archive.KeepLocal, "keep local WAL even when archived and consumed")
	fs.Uint64Var(&c.Archive.Retain, "archive-retain", c.Archive.Retain, "with no WAL consumer (a writeback-mode pageserver): remove archived WAL more than this many bytes below the flush LSN (0: keep it until a consumer reports)")
	fs.DurationVar(&c.Archive.ConsumerExpiry, "archive-consumer-expiry", c.Archive.ConsumerExpiry, "forget a WAL consumer (pageserver) that stays behind the commit LSN without progress this long, so that it no longer holds local WAL (0: never)")
	fs.DurationVar(&c.Archive.Takeover, "archive-takeover", c.Archive.Takeover, "upload a segment another safekeeper owns when it is still missing this long after it could have been (0: 30s)")
}
