package analyze

import (
	"bufio"
	"io"
)

// escapedBare reads r with every "<" that cannot open markup and every
// "&" that starts no entity reference escaped (&lt;, &amp;). Traccar 6's
// GPX export prints a device's name into <name> as it is: a device
// called "Van 3 & 4" or "LKW <7,5t" made the whole export malformed XML,
// and a strict reader refused it. Markup that is there is left alone, so
// the reader stays strict about everything else (a tag left open, one
// closed twice).
type escapedBare struct {
	r       *bufio.Reader
	pending []byte
}

// maxEntity is the longest entity reference read as one: &#x10FFFF; and
// the names XML and HTML define fit.
const maxEntity = 12

func newEscapedBare(r io.Reader) *escapedBare {
	return &escapedBare{r: bufio.NewReaderSize(r, 64<<10)}
}

func (e *escapedBare) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(e.pending) > 0 {
			c := copy(p[n:], e.pending)
			e.pending, n = e.pending[c:], n+c
			continue
		}
		b, err := e.r.ReadByte()
		if err != nil {
			if n > 0 {
				return n, nil
			}
			return 0, err
		}
		switch {
		case b == '<' && !e.opensMarkup():
			e.pending = []byte("&lt;")
		case b == '&' && !e.startsEntity():
			e.pending = []byte("&amp;")
		default:
			p[n] = b
			n++
		}
	}
	return n, nil
}

// opensMarkup reports whether the "<" just read is followed by what a tag,
// an end tag, a declaration, a comment or CDATA starts with. A byte past
// ASCII may start a name; the end of the document is left to the XML
// reader to refuse.
func (e *escapedBare) opensMarkup() bool {
	next, err := e.r.Peek(1)
	if err != nil {
		return true
	}
	c := next[0]
	return c >= 0x80 || isLetter(c) || c == '_' || c == ':' || c == '/' || c == '?' || c == '!'
}

// startsEntity reports whether the "&" just read starts a reference:
// a name, "#" and digits, or "#x" and hex digits, then ";".
func (e *escapedBare) startsEntity() bool {
	next, _ := e.r.Peek(maxEntity)
	i := 0
	switch {
	case len(next) > 1 && next[0] == '#' && (next[1] == 'x' || next[1] == 'X'):
		i = 2
		for i < len(next) && isHex(next[i]) {
			i++
		}
		if i == 2 {
			return false
		}
	case len(next) > 0 && next[0] == '#':
		i = 1
		for i < len(next) && isDigit(next[i]) {
			i++
		}
		if i == 1 {
			return false
		}
	case len(next) > 0 && (isLetter(next[0]) || next[0] == '_'):
		for i < len(next) && (isLetter(next[i]) || isDigit(next[i]) || next[i] == '_' || next[i] == '-' || next[i] == '.') {
			i++
		}
	default:
		return false
	}
	return i < len(next) && next[i] == ';'
}

func isLetter(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }
func isDigit(c byte) bool  { return c >= '0' && c <= '9' }
func isHex(c byte) bool    { return isDigit(c) || c|0x20 >= 'a' && c|0x20 <= 'f' }
