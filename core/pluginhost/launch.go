package pluginhost

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/stratadb/strata/sdk/plugin"
)

// ErrChecksum: the plugin binary's SHA-256 is not the configured one.
var ErrChecksum = errors.New("pluginhost: plugin binary checksum mismatch")

// ErrVersion: the plugin speaks no protocol version this host supports.
var ErrVersion = errors.New("pluginhost: unsupported plugin protocol version")

// process is one running plugin process and the contract value dispensed
// from it.
type process struct {
	client *goplugin.Client
	rpc    goplugin.ClientProtocol
	raw    any // the dispensed contract client, e.g. *objectstore.GRPCClient
	pid    int
}

func (p *process) exited() bool { return p.client.Exited() }

// pingTimeout bounds the health check that tells a dead or hung plugin
// from a backend's own transient error.
const pingTimeout = 2 * time.Second

// alive reports whether the plugin still answers a health check within
// pingTimeout.
func (p *process) alive() bool {
	if p.client.Exited() {
		return false
	}
	gc, ok := p.rpc.(*goplugin.GRPCClient)
	if !ok {
		return p.rpc.Ping() == nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	_, err := healthpb.NewHealthClient(gc.Conn).Check(ctx, &healthpb.HealthCheckRequest{Service: goplugin.GRPCServiceName})
	return err == nil
}

// waitExit waits up to d for the process to exit and reports whether it did.
func (p *process) waitExit(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for !p.client.Exited() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// kill stops the process (gracefully, then by force after 2 seconds) and
// waits for it.
func (p *process) kill() { p.client.Kill() }

// launch starts spec's binary as a plugin of the given kind and protocol
// version, and dispenses the kind. Errors name the plugin and the binary.
func launch(spec Spec, kind string, version int, shim goplugin.Plugin, opts Options, log zerolog.Logger) (*process, error) {
	if spec.Name == "" {
		spec.Name = filepath.Base(spec.Path)
	}
	what := fmt.Sprintf("%s plugin %q (%s)", kind, spec.Name, spec.Path)
	if spec.Path == "" {
		return nil, fmt.Errorf("pluginhost: %s plugin %q: no binary path configured", kind, spec.Name)
	}
	fi, err := os.Stat(spec.Path)
	if err != nil {
		return nil, fmt.Errorf("pluginhost: %s: cannot start: %w", what, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("pluginhost: %s: cannot start: not an executable file (mode %v)", what, fi.Mode())
	}

	var secure *goplugin.SecureConfig
	if spec.SHA256 != "" {
		want, err := hex.DecodeString(strings.TrimSpace(spec.SHA256))
		if err != nil || len(want) != sha256.Size {
			return nil, fmt.Errorf("pluginhost: %s: sha256 %q is not 64 hex digits", what, spec.SHA256)
		}
		got, err := fileSHA256(spec.Path)
		if err != nil {
			return nil, fmt.Errorf("pluginhost: %s: cannot start: %w", what, err)
		}
		if got != hex.EncodeToString(want) {
			return nil, fmt.Errorf("%w: %s has SHA-256 %s, the config expects %s; refusing to run it",
				ErrChecksum, what, got, hex.EncodeToString(want))
		}
		// go-plugin checks again right before it executes the binary.
		secure = &goplugin.SecureConfig{Checksum: want, Hash: sha256.New()}
	} else {
		log.Warn().Str("path", spec.Path).Msg("plugin runs without a configured sha256 checksum")
	}

	plog := log.With().Str("plugin", spec.Name).Str("kind", kind).Logger()
	cmd := exec.Command(spec.Path, spec.Args...)
	dieWithHost(cmd)
	if dir, err := socketDir(); err == nil {
		// go-plugin adds the host's environment after this.
		cmd.Env = []string{goplugin.EnvUnixSocketDir + "=" + dir}
	} else {
		log.Warn().Err(err).Msg("no private folder for plugin sockets; they go to the temporary folder")
	}
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  plugin.Handshake,
		VersionedPlugins: map[int]goplugin.PluginSet{version: {kind: shim}},
		Cmd:              cmd,
		SecureConfig:     secure,
		AutoMTLS:         true,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		StartTimeout:     opts.StartTimeout,
		// go-plugin's own Debug chatter stays out; the plugin's own lines
		// pass at whatever level the host's zerolog logger allows.
		Logger:     newHCLog(plog, hclog.Trace),
		SyncStdout: &lineWriter{emit: func(l string) { plog.Info().Str("stream", "stdout").Msg(l) }},
		SyncStderr: &lineWriter{emit: func(l string) { plog.Warn().Str("stream", "stderr").Msg(l) }},
		Stderr:     io.Discard,
	})
	rpc, err := client.Client()
	if err != nil {
		client.Kill()
		msg := err.Error()
		switch {
		case errors.Is(err, goplugin.ErrChecksumsDoNotMatch):
			return nil, fmt.Errorf("%w: %s changed since it was checked", ErrChecksum, what)
		case strings.Contains(msg, "incompatible API version"):
			return nil, fmt.Errorf("%w: %s: this strata speaks %s protocol version %d only (%v); rebuild the plugin against a matching strata SDK",
				ErrVersion, what, kind, version, err)
		case strings.Contains(msg, "Unrecognized remote plugin message"):
			return nil, fmt.Errorf("pluginhost: %s: cannot start: it is not a strata plugin, or it wrote to stdout before the handshake: %w", what, err)
		case strings.Contains(msg, "incompatible core API version"):
			return nil, fmt.Errorf("%w: %s: the plugin was built with an incompatible go-plugin (%v)", ErrVersion, what, err)
		}
		return nil, fmt.Errorf("pluginhost: %s: cannot start: %w", what, err)
	}
	raw, err := rpc.Dispense(kind)
	if err != nil {
		client.Kill()
		return nil, fmt.Errorf("pluginhost: %s: the binary is a strata plugin but does not serve %s: %w", what, kind, err)
	}
	pid, _ := strconv.Atoi(client.ID())
	plog.Info().Int("pid", pid).Int("protocol", client.NegotiatedVersion()).Str("path", spec.Path).Msg("plugin started")
	return &process{client: client, rpc: rpc, raw: raw, pid: pid}, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// FileSHA256 returns the hex SHA-256 of a file: the value to put in a
// plugin's sha256 config key.
func FileSHA256(path string) (string, error) { return fileSHA256(path) }

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
