package plugin

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorCode ties one sentinel error of a contract to the gRPC status code
// that carries it across the process boundary.
type ErrorCode struct {
	Code     codes.Code
	Sentinel error
	// Wrap, if not nil, builds the host-side error from the rebuilt remote
	// error (which already matches Sentinel): for marker errors that have
	// their own constructor, such as objectstore.Transient.
	Wrap func(error) error
}

// ErrorMap is a contract's table of sentinel errors and status codes. Each
// code and each sentinel should appear once. The context errors
// (context.Canceled as Canceled, context.DeadlineExceeded as
// DeadlineExceeded) are always mapped and take precedence, so that a call
// cancelled by its caller answers errors.Is(err, ctx.Err()) on the host
// whatever the plugin wrapped around it.
//
// Plugin side: return m.ToStatus(err) from every RPC handler.
// Host side: return m.FromStatus(err) for every error an RPC returns.
// The error text survives the trip unchanged.
type ErrorMap []ErrorCode

var contextCodes = []ErrorCode{
	{Code: codes.Canceled, Sentinel: context.Canceled},
	{Code: codes.DeadlineExceeded, Sentinel: context.DeadlineExceeded},
}

// ToStatus converts err into a gRPC status error whose code names the first
// matching sentinel and whose message is err.Error(). An error that matches
// no sentinel keeps the code of a status it carries, or becomes Unknown.
// ToStatus(nil) is nil.
func (m ErrorMap) ToStatus(err error) error {
	if err == nil {
		return nil
	}
	for _, table := range [][]ErrorCode{contextCodes, m} {
		for _, ec := range table {
			if errors.Is(err, ec.Sentinel) {
				return status.Error(ec.Code, err.Error())
			}
		}
	}
	if s, ok := status.FromError(err); ok {
		return status.Error(s.Code(), err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

// FromStatus converts an error returned by a gRPC call back into the
// contract's terms: its Error() is the status message, and errors.Is
// matches the sentinel mapped to the status code (if any). The result still
// answers status.Code. An error that is not a gRPC status is returned as is.
// FromStatus(nil) is nil.
func (m ErrorMap) FromStatus(err error) error {
	if err == nil {
		return nil
	}
	s, ok := status.FromError(err)
	if !ok {
		return err
	}
	re := &RemoteError{code: s.Code(), msg: s.Message()}
	for _, table := range [][]ErrorCode{contextCodes, m} {
		for _, ec := range table {
			if ec.Code == s.Code() {
				re.sentinel = ec.Sentinel
				if ec.Wrap != nil {
					return ec.Wrap(re)
				}
				return re
			}
		}
	}
	return re
}

// RemoteError is an error that came back from a plugin. It unwraps to the
// sentinel its status code maps to, if any.
type RemoteError struct {
	code     codes.Code
	msg      string
	sentinel error
}

func (e *RemoteError) Error() string { return e.msg }

// Unwrap returns the mapped sentinel, or nil.
func (e *RemoteError) Unwrap() error { return e.sentinel }

// Code is the gRPC status code the plugin sent.
func (e *RemoteError) Code() codes.Code { return e.code }

// GRPCStatus lets status.Code and status.FromError see the original status.
func (e *RemoteError) GRPCStatus() *status.Status { return status.New(e.code, e.msg) }
