package fleetsim

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Fields names the top-level JSON members of a ping body.
type Fields struct {
	// Asset holds the asset id, a string. Default asset_id.
	Asset string
	// Time holds the device time, RFC 3339 with milliseconds in UTC.
	// Default occurred_at.
	Time string
	// Lat and Lon hold the position, numbers with 7 decimals. Default lat
	// and lon.
	Lat, Lon string
	// Accuracy holds the accuracy radius in metres, sent when reported.
	// Default accuracy.
	Accuracy string
	// Speed holds the speed in m/s, sent when reported. Default speed.
	Speed string
}

// withDefaults returns f with every empty name set to its default.
func (f Fields) withDefaults() Fields {
	f.Asset = cmp.Or(f.Asset, "asset_id")
	f.Time = cmp.Or(f.Time, "occurred_at")
	f.Lat = cmp.Or(f.Lat, "lat")
	f.Lon = cmp.Or(f.Lon, "lon")
	f.Accuracy = cmp.Or(f.Accuracy, "accuracy")
	f.Speed = cmp.Or(f.Speed, "speed")
	return f
}

// body returns the request body of the pings: one JSON object, or a JSON
// array for a batch.
func (f Fields) body(pings []Ping, batch bool) []byte {
	if !batch {
		return f.appendPing(nil, pings[0])
	}
	b := []byte{'['}
	for i, p := range pings {
		if i > 0 {
			b = append(b, ',')
		}
		b = f.appendPing(b, p)
	}
	return append(b, ']')
}

// appendPing appends p as one JSON object.
func (f Fields) appendPing(b []byte, p Ping) []byte {
	b = append(b, '{')
	b = appendMember(b, f.Asset, jsonString(p.Asset))
	b = append(b, ',')
	b = appendMember(b, f.Time, jsonString(timeText(p.Time)))
	b = append(b, ',')
	b = appendMember(b, f.Lat, coordText(p.Lat))
	b = append(b, ',')
	b = appendMember(b, f.Lon, coordText(p.Lon))
	if p.Accuracy != 0 {
		b = append(b, ',')
		b = appendMember(b, f.Accuracy, strconv.FormatFloat(p.Accuracy, 'f', -1, 64))
	}
	if p.HasSpeed {
		b = append(b, ',')
		b = appendMember(b, f.Speed, strconv.FormatFloat(p.Speed, 'f', -1, 64))
	}
	return append(b, '}')
}

// appendMember appends "name":value, the value already JSON.
func appendMember(b []byte, name, value string) []byte {
	b = append(b, jsonString(name)...)
	b = append(b, ':')
	return append(b, value...)
}

// jsonString returns s as a JSON string literal.
func jsonString(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

// timeText formats a device time as sent: RFC 3339, milliseconds, Z.
func timeText(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// coordText formats a coordinate as sent, with 7 decimals.
func coordText(v float64) string {
	return strconv.FormatFloat(v, 'f', 7, 64)
}

// contentKey identifies a ping by what is sent of it that a deduplicator
// keys on: the upstream recognises it by the same values.
func contentKey(asset, time, lat, lon string) string {
	return strings.Join([]string{asset, time, lat, lon}, "\x00")
}

// pingKey returns the content key of a ping about to be sent.
func pingKey(p Ping) string {
	return contentKey(p.Asset, timeText(p.Time), coordText(p.Lat), coordText(p.Lon))
}

const (
	// maxTries bounds the attempts at one request answered 409 in_flight.
	maxTries = 10
	// maxAnswerBody is how much of an answer's body is kept, for errors.
	maxAnswerBody = 64 << 10
)

// HTTPDecider is a Decider that POSTs every delivery to a URL, a Caddy with
// telemetry_dedup, as Content-Type application/json: a single ping as one
// JSON object, a batch as a JSON array. It is safe for concurrent use.
//
// With an upstream, it runs the backend itself: Caddy must reverse_proxy to
// its address, and a ping is accepted if the backend received it while the
// ping's delivery was being made. That works for batches, whose answer does
// not say which elements went through. The backend answers 201.
//
// Without an upstream it trusts the X-Dedup response header, and so sends a
// batch as consecutive single requests in the batch's order: accepted or
// unchecked is accepted, suppressed is not.
//
// Either way, a 409 with X-Dedup: in_flight is retried after its
// Retry-After seconds, up to 10 attempts, and any answer not listed above is
// an error that names its status, headers and body.
type HTTPDecider struct {
	url      string
	fields   Fields
	client   *http.Client
	upstream *upstream // nil without one
}

// NewHTTPDecider returns an HTTPDecider posting to url with the given field
// names (zero fields take their defaults). A non-empty upstreamAddr, such as
// 127.0.0.1:9001 or 127.0.0.1:0, is where it listens as the backend; Close
// stops it.
func NewHTTPDecider(url, upstreamAddr string, fields Fields) (*HTTPDecider, error) {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	// Concurrent workers would otherwise keep reconnecting: the default
	// keeps only 2 idle connections per host.
	transport.MaxIdleConnsPerHost = 256
	h := &HTTPDecider{
		url:    url,
		fields: fields.withDefaults(),
		client: &http.Client{Transport: transport, Timeout: time.Minute},
	}
	if upstreamAddr != "" {
		u, err := startUpstream(upstreamAddr, h.fields)
		if err != nil {
			return nil, err
		}
		h.upstream = u
	}
	return h, nil
}

// UpstreamAddr returns the address the backend listens on, with the port
// chosen when asked for port 0, or "" without an upstream.
func (h *HTTPDecider) UpstreamAddr() string {
	if h.upstream == nil {
		return ""
	}
	return h.upstream.addr()
}

// Close stops the backend, if any, and closes idle connections.
func (h *HTTPDecider) Close() error {
	h.client.CloseIdleConnections()
	if h.upstream == nil {
		return nil
	}
	return h.upstream.close()
}

// Deliver makes the delivery; see HTTPDecider for how acceptance is told.
func (h *HTTPDecider) Deliver(ctx context.Context, d Delivery) ([]bool, error) {
	if h.upstream != nil {
		return h.deliverToUpstream(ctx, d)
	}
	accepted := make([]bool, len(d.Pings))
	for i, p := range d.Pings {
		ok, err := h.deliverByHeader(ctx, p)
		if err != nil {
			return nil, err
		}
		accepted[i] = ok
	}
	return accepted, nil
}

// deliverToUpstream sends the delivery as it is and asks the backend which
// of its pings arrived. A worker owns every delivery of its assets, so no
// other request in flight can carry the same pings.
func (h *HTTPDecider) deliverToUpstream(ctx context.Context, d Delivery) ([]bool, error) {
	keys := make([]string, len(d.Pings))
	for i, p := range d.Pings {
		keys[i] = pingKey(p)
	}
	before := h.upstream.received(keys)
	a, err := h.post(ctx, h.fields.body(d.Pings, d.Batch))
	if err != nil {
		return nil, err
	}
	if !a.succeeded() {
		return nil, a.unexpected()
	}
	after := h.upstream.received(keys)
	accepted := make([]bool, len(keys))
	for i := range keys {
		accepted[i] = after[i] > before[i]
	}
	if dedup := a.header.Get("X-Dedup"); !slices.Contains(accepted, true) && (dedup == "accepted" || dedup == "partial") {
		// Otherwise a Caddy proxying elsewhere would score as a decider
		// that suppresses everything.
		return nil, fmt.Errorf("X-Dedup says %s, but nothing reached the backend on %s: does Caddy reverse_proxy to it? %w",
			dedup, h.upstream.addr(), a.unexpected())
	}
	return accepted, nil
}

// deliverByHeader sends one ping and reads the decision from X-Dedup. An
// accepted ping whose backend did not take it (anything but a 2xx) is an
// error: the module released its claim for a retry the simulated sender
// does not make.
func (h *HTTPDecider) deliverByHeader(ctx context.Context, p Ping) (bool, error) {
	a, err := h.post(ctx, h.fields.body([]Ping{p}, false))
	if err != nil {
		return false, err
	}
	switch a.header.Get("X-Dedup") {
	case "accepted", "unchecked":
		if a.succeeded() {
			return true, nil
		}
	case "suppressed":
		return false, nil
	}
	return false, a.unexpected()
}

// post sends the body, again after Retry-After while the answer is 409
// in_flight, up to maxTries attempts; it returns the last answer.
func (h *HTTPDecider) post(ctx context.Context, body []byte) (answer, error) {
	for try := 1; ; try++ {
		a, err := h.postOnce(ctx, body)
		if err != nil || !a.inFlight() || try == maxTries {
			return a, err
		}
		if err := sleep(ctx, a.retryAfter()); err != nil {
			return answer{}, err
		}
	}
}

// postOnce sends the body once and reads the answer.
func (h *HTTPDecider) postOnce(ctx context.Context, body []byte) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBody))
	if err != nil {
		return answer{}, fmt.Errorf("reading the answer: %w", err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// answer is an HTTP response, read.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// succeeded reports a 2xx: what the module settles a claim on.
func (a answer) succeeded() bool { return a.status >= 200 && a.status < 300 }

// inFlight says the module asks for the request again later, because the
// first delivery of a ping in it is still being decided.
func (a answer) inFlight() bool {
	return a.status == http.StatusConflict && a.header.Get("X-Dedup") == "in_flight"
}

// retryAfter returns the wait the answer asks for, 1 s when it asks for
// none that can be read, as the module's default.
func (a answer) retryAfter() time.Duration {
	s, err := strconv.Atoi(a.header.Get("Retry-After"))
	if err != nil || s < 0 {
		return time.Second
	}
	return time.Duration(s) * time.Second
}

// unexpected describes an answer the simulator cannot score.
func (a answer) unexpected() error {
	return fmt.Errorf("unexpected answer %d %s, headers %v, body %q",
		a.status, http.StatusText(a.status), a.header, a.body)
}
