package objectstore

import (
	"context"
	"fmt"
	"io"
	"strings"
)

// WithPrefix returns a Store that keeps every object of s under prefix: the
// key k of the returned store is the key prefix + "/" + k of s (trailing
// slashes of prefix are ignored, so "tenants/a" and "tenants/a/" are the
// same). Keys seen by the caller, in arguments, errors aside, and in List,
// are without the prefix; List of the returned store only sees objects under
// the prefix. An empty prefix returns s itself.
//
// Keys of the returned store are limited to MaxKeyLen-len(prefix)-1 bytes,
// since s enforces MaxKeyLen on the joined key.
//
// The prefix must itself be a valid key (ValidateKey); if it is not, every
// call of the returned store fails with ErrInvalidKey. Closing the returned
// store closes s.
func WithPrefix(s Store, prefix string) Store {
	prefix = strings.TrimRight(prefix, "/")
	if prefix == "" {
		return s
	}
	return &prefixStore{s: s, prefix: prefix + "/", err: ValidateKey(prefix)}
}

type prefixStore struct {
	s      Store
	prefix string
	err    error // of the prefix
}

var _ Store = (*prefixStore)(nil)

// full checks the caller's key and returns the inner one. The caller's key
// is checked on its own (a key "a/../b" must not escape the prefix), and the
// joined key too (it may exceed MaxKeyLen).
func (p *prefixStore) full(key string) (string, error) {
	if p.err != nil {
		return "", fmt.Errorf("prefix %q: %w", p.prefix, p.err)
	}
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	return p.prefix + key, nil
}

func (p *prefixStore) Put(ctx context.Context, key string, r io.Reader, opts PutOptions) error {
	k, err := p.full(key)
	if err != nil {
		return err
	}
	return p.s.Put(ctx, k, r, opts)
}

func (p *prefixStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	k, err := p.full(key)
	if err != nil {
		return nil, err
	}
	return p.s.Get(ctx, k)
}

func (p *prefixStore) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	k, err := p.full(key)
	if err != nil {
		return nil, err
	}
	return p.s.GetRange(ctx, k, off, length)
}

func (p *prefixStore) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	k, err := p.full(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	info, err := p.s.Stat(ctx, k)
	info.Key = strings.TrimPrefix(info.Key, p.prefix)
	return info, err
}

func (p *prefixStore) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	if p.err != nil {
		return fmt.Errorf("prefix %q: %w", p.prefix, p.err)
	}
	return p.s.List(ctx, p.prefix+prefix, func(info ObjectInfo) error {
		info.Key = strings.TrimPrefix(info.Key, p.prefix)
		return fn(info)
	})
}

func (p *prefixStore) Delete(ctx context.Context, key string) error {
	k, err := p.full(key)
	if err != nil {
		return err
	}
	return p.s.Delete(ctx, k)
}

func (p *prefixStore) Close() error { return p.s.Close() }
