package fs

import (
	"path/filepath"
	"strings"

	"github.com/stratadb/strata/sdk/objectstore"
)

// How keys map to paths under Root.
//
// The store is a flat namespace, so a key may be both an object and the
// prefix of other objects ("a/b" and "a/b/c"), which a naive mapping (key
// segment = directory) cannot store: "a/b" would have to be a file and a
// directory at once. Names are therefore marked:
//
//   - every key segment is escaped: '%' becomes "%25" (so a '%' in a name
//     is always either an escape or a marker);
//   - the last segment of a key is a regular file named by the escaped
//     segment itself: key "layers/000001" is the file "layers%/000001";
//   - every other segment is a directory named by the escaped segment plus
//     a "%": "layers%";
//   - an escaped segment longer than maxPiece bytes (file names are
//     limited to 255 bytes) is cut into pieces; every piece but the last is
//     a directory named piece + "%+".
//
// Operators therefore see object files under their own names, in
// directories that end in '%'. The temporary area is Root/%tmp, a name that
// no key produces. Paths are limited by PATH_MAX (4096 bytes): a key of
// 1,024 bytes fits, unless it has hundreds of '%' (each takes 3 bytes).

const (
	maxPiece  = 240
	dirMark   = "%"
	contMark  = "%+"
	tmpDirNam = "%tmp"
)

func escapeSegment(s string) string { return strings.ReplaceAll(s, "%", "%25") }

// unescape undoes escapeSegment on an escaped key (segments joined by '/').
// It reports false when esc is not the escape of any string, i.e. the name
// did not come from this store.
func unescape(esc string) (string, bool) {
	if !strings.Contains(esc, "%") {
		return esc, true
	}
	var b strings.Builder
	for i := 0; i < len(esc); i++ {
		if esc[i] != '%' {
			b.WriteByte(esc[i])
			continue
		}
		if !strings.HasPrefix(esc[i:], "%25") {
			return "", false
		}
		b.WriteByte('%')
		i += 2
	}
	return b.String(), true
}

// pieces cuts an escaped segment into names of at most maxPiece bytes. The
// last piece is never "." or ".." (it may become a file name on its own).
func pieces(esc string) []string {
	var out []string
	for len(esc) > maxPiece {
		n := maxPiece
		if rest := len(esc) - n; rest <= 2 {
			n -= 3 // leave the last piece at least 3 bytes
		}
		out = append(out, esc[:n])
		esc = esc[n:]
	}
	return append(out, esc)
}

// dirNames returns the directory names of a non-final key segment.
func dirNames(seg string) []string {
	ps := pieces(escapeSegment(seg))
	for i := range ps {
		if i < len(ps)-1 {
			ps[i] += contMark
		} else {
			ps[i] += dirMark
		}
	}
	return ps
}

// fileNames returns the names of the final key segment: continuation
// directories, then the file name.
func fileNames(seg string) []string {
	ps := pieces(escapeSegment(seg))
	for i := 0; i < len(ps)-1; i++ {
		ps[i] += contMark
	}
	return ps
}

// relPath maps a valid key to its path relative to Root.
func relPath(key string) string {
	segs := strings.Split(key, "/")
	var names []string
	for _, seg := range segs[:len(segs)-1] {
		names = append(names, dirNames(seg)...)
	}
	names = append(names, fileNames(segs[len(segs)-1])...)
	return filepath.Join(names...)
}

// relDir maps the full segments of a List prefix (the part up to its last
// '/') to a directory relative to Root, and returns the escaped key prefix
// that directory stands for. A prefix without '/' starts at Root.
func relDir(prefix string) (dir, escKeyPrefix string) {
	i := strings.LastIndexByte(prefix, '/')
	if i < 0 {
		return "", ""
	}
	var names []string
	for _, seg := range strings.Split(prefix[:i], "/") {
		names = append(names, dirNames(seg)...)
		escKeyPrefix += escapeSegment(seg) + "/"
	}
	return filepath.Join(names...), escKeyPrefix
}

type nameKind int

const (
	kindFile nameKind = iota
	kindDir
	kindCont
)

// classify tells what a directory entry name stands for and returns its
// escaped piece.
func classify(name string) (nameKind, string) {
	switch {
	case strings.HasSuffix(name, contMark):
		return kindCont, strings.TrimSuffix(name, contMark)
	case strings.HasSuffix(name, dirMark):
		return kindDir, strings.TrimSuffix(name, dirMark)
	default:
		return kindFile, name
	}
}

// keyOf decodes an escaped key found by a walk, and checks it.
func keyOf(esc string) (string, bool) {
	key, ok := unescape(esc)
	if !ok || objectstore.ValidateKey(key) != nil {
		return "", false
	}
	return key, true
}
