package analyze

import (
	"bufio"
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// gpxAsset is the asset id of a GPX document's pings: Traccar exports one
// device's route a file, so the whole document is one asset.
const gpxAsset = "gpx"

// isGPX says whether the capture is a GPX document: its first non-space
// byte (after the file's byte order mark, which read skips) is the '<' of
// XML (a declaration, a comment, a doctype or the root, prefixed or not),
// which no JSON text, query string, URL or .rec line starts with. readGPX
// says so when the root is not gpx.
func isGPX(br *bufio.Reader) bool {
	head, _ := br.Peek(br.Size())
	head = bytes.TrimLeft(head, " \t\r\n")
	return bytes.HasPrefix(head, []byte("<"))
}

// gpxPoint is what a trkpt holds that a ping needs.
type gpxPoint struct {
	Lat  *string `xml:"lat,attr"`
	Lon  *string `xml:"lon,attr"`
	Time *string `xml:"time"`
}

// readGPX reads a GPX document as Traccar's GpxExportProvider writes it:
// every trkpt, in document order, is a ping of the one asset gpxAsset,
// from its lat and lon attributes and its RFC 3339 time (Traccar writes
// its fix time with an offset), validated as a JSON ping is. The document
// counts as one line holding its track points; a point without lat, lon or
// time, or with one that cannot be read, is skipped as malformed, and a
// note names the first (an error, when no point can be read). Other
// elements (wpt, rtept) are not read.
func (a *analyzer) readGPX(r io.Reader) ([]*assetFixes, error) {
	as := &assetFixes{name: gpxAsset}
	d := xml.NewDecoder(newEscapedBare(r))
	var charset declaredCharset
	d.CharsetReader = charset.reader
	a.report.Lines = 1
	points, malformed, firstBad := 0, 0, ""
	for depth, roots := 0, 0; ; {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			if err := charset.notUTF8(err); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("reading the GPX document after track point %d: %w; give the whole file as exported", points, err)
		}
		var start xml.StartElement
		switch t := tok.(type) {
		case xml.StartElement:
			start = t
		case xml.EndElement:
			depth--
			continue
		default:
			continue
		}
		if depth == 0 {
			if roots++; roots > 1 {
				return nil, fmt.Errorf("the capture holds more than one GPX document (a second <%s> after track point %d); "+
					"a GPX export is one device's route, and analyze reads one device a run: analyze each export on its own", start.Name.Local, points)
			}
			if start.Name.Local != "gpx" {
				return nil, fmt.Errorf("the capture is an XML document of <%s>, not <gpx>; analyze reads GPX (as Traccar exports a route) or pings one a line", start.Name.Local)
			}
		}
		if start.Name.Local != "trkpt" {
			depth++
			continue
		}
		points++
		var pt gpxPoint
		if err := d.DecodeElement(&pt, &start); err != nil {
			if err := charset.notUTF8(err); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("reading GPX track point %d: %w; give the whole file as exported", points, err)
		}
		p, err := pt.ping()
		if err == nil {
			err = a.opts.Parser.Validate(p, time.Time{})
		}
		if err != nil {
			reason := skipReason(err)
			if reason == SkipMalformed {
				if malformed == 0 {
					firstBad = fmt.Sprintf("track point %d %v", points, err)
				}
				malformed++
			}
			a.skip(reason, "track point", points, err)
			continue
		}
		a.report.Elements++
		a.report.Pings++
		as.fixes = append(as.fixes, fixPoint{t: p.Time, lat: p.Lat, lon: p.Lon})
	}
	if points == 0 {
		return nil, errors.New("the GPX document holds no track point (trkpt); export a route with positions from Traccar (reports, route, export)")
	}
	if malformed == points {
		return nil, fmt.Errorf("none of the %d GPX track points can be read, the first: %s; Traccar's route export writes lat, lon and time on every trkpt", points, firstBad)
	}
	if malformed > 0 {
		a.note("%d GPX track points skipped as malformed, the first: %s", malformed, firstBad)
	}
	if len(as.fixes) == 0 {
		return nil, nil
	}
	return []*assetFixes{as}, nil
}

// declaredCharset reads a document that declares an encoding other than
// UTF-8 as UTF-8 all the same (encoding/xml reads only that): iconv
// converts a document's bytes but leaves its declaration as it was, and
// an ASCII document is UTF-8 whatever it declares. A byte that is not
// UTF-8 is refused then, saying how to convert the document.
type declaredCharset struct{ label string }

// reader is the decoder's CharsetReader: it is asked only for an
// encoding other than UTF-8, and keeps the document's bytes as they are.
func (c *declaredCharset) reader(label string, input io.Reader) (io.Reader, error) {
	c.label = label
	return input, nil
}

// notUTF8 says how to convert the document when err is the decoder
// finding a byte that is not UTF-8 in one that declares another encoding;
// else it is nil.
func (c *declaredCharset) notUTF8(err error) error {
	var syntax *xml.SyntaxError
	if c.label == "" || !errors.As(err, &syntax) || syntax.Msg != "invalid UTF-8" {
		return nil
	}
	return fmt.Errorf("the GPX document is in %s, and analyze reads UTF-8; convert it first: iconv -f %s -t UTF-8 route.gpx > route-utf8.gpx", c.label, c.label)
}

// ping reads the point's fields; an error says which one is missing or
// unreadable.
func (pt gpxPoint) ping() (ping.Ping, error) {
	if pt.Time == nil {
		return ping.Ping{}, errors.New("has no <time>")
	}
	if pt.Lat == nil || pt.Lon == nil {
		return ping.Ping{}, errors.New("lacks a lat or lon attribute")
	}
	t, err := time.Parse(time.RFC3339, *pt.Time)
	if err != nil {
		return ping.Ping{}, fmt.Errorf("has a <time> that is not RFC 3339 with an offset: %q", *pt.Time)
	}
	lat, err := strconv.ParseFloat(*pt.Lat, 64)
	if err != nil {
		return ping.Ping{}, fmt.Errorf("has a lat that is not a number: %q", *pt.Lat)
	}
	lon, err := strconv.ParseFloat(*pt.Lon, 64)
	if err != nil {
		return ping.Ping{}, fmt.Errorf("has a lon that is not a number: %q", *pt.Lon)
	}
	return ping.Ping{Asset: gpxAsset, Time: t, Lat: lat, Lon: lon}, nil
}
