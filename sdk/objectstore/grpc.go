package objectstore

// The gRPC shim: an objectstore.Store served by an external plugin process
// (grpc_server.go) and used by the host as a plain Store (grpc_client.go).
// Wire types (sdk/internal/objectstorepb) never leave these files.

import (
	"context"
	"errors"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/stratadb/strata/sdk/internal/objectstorepb"
	"github.com/stratadb/strata/sdk/plugin"
)

const (
	// PluginKind is the name an object store plugin is dispensed under.
	PluginKind = "objectstore"
	// PluginProtocolVersion is the version of the object store plugin
	// protocol (sdk/internal/objectstorepb/objectstore.proto) this package
	// speaks. A host refuses plugins built for another version.
	PluginProtocolVersion = 1

	// chunkSize is the largest data chunk in one gRPC message: well under
	// gRPC's default 4 MiB message limit, large enough to amortize the
	// per-message cost.
	chunkSize = 1 << 20
	// listBatch is the number of ObjectInfo per List message.
	listBatch = 1000
)

// errorMap is how the object store's sentinel errors cross a plugin
// boundary. errors.Is answers the same on both sides: a plugin's
// ErrNotFound is ErrNotFound on the host, with the same text. It is never
// modified.
var errorMap = plugin.ErrorMap{
	{Code: codes.NotFound, Sentinel: ErrNotFound},
	{Code: codes.AlreadyExists, Sentinel: ErrExists},
	{Code: codes.InvalidArgument, Sentinel: ErrInvalidKey},
	{Code: codes.OutOfRange, Sentinel: ErrInvalidRange},
	{Code: codes.Unavailable, Sentinel: ErrTransient, Wrap: Transient},
	{Code: codes.FailedPrecondition, Sentinel: ErrClosed},
}

// PluginFactory opens the Store a plugin serves, from the plugin's own
// config section (JSON, as the host's config holds it; may be "{}" or
// empty) and a logger whose lines the host forwards into its own log.
type PluginFactory func(configJSON []byte, log zerolog.Logger) (Store, error)

// ServePlugin serves the Store that factory opens as an external strata
// object store plugin, and exits when the host stops the plugin. It is the
// whole main of a plugin binary:
//
//	func main() { objectstore.ServePlugin(myFactory) }
func ServePlugin(factory PluginFactory) {
	plugin.Serve(plugin.ServeConfig{
		Kind:    PluginKind,
		Version: PluginProtocolVersion,
		Plugin:  &GRPCPlugin{Factory: factory, Log: plugin.Logger()},
	})
}

// GRPCPlugin is the go-plugin glue of the object store contract. A plugin
// sets Factory and Log; a host leaves them zero and receives a *GRPCClient
// when it dispenses PluginKind.
type GRPCPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	Factory PluginFactory
	Log     zerolog.Logger
}

var _ goplugin.GRPCPlugin = (*GRPCPlugin)(nil)

// GRPCServer registers the object store service (plugin side).
func (p *GRPCPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	if p.Factory == nil {
		return errors.New("objectstore: GRPCPlugin.Factory is nil")
	}
	objectstorepb.RegisterObjectStoreServer(s, newGRPCServer(p.Factory, p.Log))
	return nil
}

// GRPCClient returns a *GRPCClient over conn (host side).
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return NewGRPCClient(conn), nil
}

func infoToProto(oi ObjectInfo) *objectstorepb.ObjectInfo {
	pi := &objectstorepb.ObjectInfo{Key: []byte(oi.Key), Size: oi.Size}
	if !oi.ModTime.IsZero() {
		pi.ModTime = timestamppb.New(oi.ModTime)
	}
	return pi
}

func infoFromProto(pi *objectstorepb.ObjectInfo) ObjectInfo {
	oi := ObjectInfo{Key: string(pi.GetKey()), Size: pi.GetSize()}
	if pi.GetModTime() != nil {
		oi.ModTime = pi.GetModTime().AsTime()
	}
	return oi
}
