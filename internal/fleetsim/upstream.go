package fleetsim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
)

// maxUpstreamBody bounds a body the backend reads; the module's own max_body
// defaults to 1 MiB.
const maxUpstreamBody = 64 << 20

// upstream is the backend of an HTTPDecider: it counts every ping it
// receives by content.
type upstream struct {
	fields Fields
	ln     net.Listener
	srv    *http.Server

	mu    sync.Mutex
	count map[string]int // by contentKey
}

// startUpstream starts the backend listening on addr.
func startUpstream(addr string, fields Fields) (*upstream, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	u := &upstream{fields: fields, ln: ln, count: map[string]int{}}
	u.srv = &http.Server{Handler: u}
	go u.srv.Serve(ln)
	return u, nil
}

// addr returns the address the backend listens on.
func (u *upstream) addr() string {
	return u.ln.Addr().String()
}

// close stops the backend.
func (u *upstream) close() error {
	return u.srv.Close()
}

// received returns how often each of the content keys has arrived.
func (u *upstream) received(keys []string) []int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := make([]int, len(keys))
	for i, k := range keys {
		n[i] = u.count[k]
	}
	return n
}

// ServeHTTP counts the pings of a JSON object or array body and answers 201.
// A body it cannot read is answered 400, which the HTTPDecider then reports
// as an error: most likely the field names do not match.
func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxUpstreamBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	keys, err := u.keys(body)
	if err != nil {
		http.Error(w, "fleetsim upstream: "+err.Error(), http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	for _, k := range keys {
		u.count[k]++
	}
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"stored":%d}`, len(keys))
}

// keys returns the content keys of the pings in a body.
func (u *upstream) keys(body []byte) ([]string, error) {
	elements := []json.RawMessage{body}
	if bytes.HasPrefix(bytes.TrimSpace(body), []byte("[")) {
		// Into a fresh slice: RawMessage reuses the storage of an element
		// already there, which would be the body being parsed.
		elements = nil
		if err := json.Unmarshal(body, &elements); err != nil {
			return nil, err
		}
	}
	keys := make([]string, len(elements))
	for i, e := range elements {
		k, err := u.key(e)
		if err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		keys[i] = k
	}
	return keys, nil
}

// key returns the content key of one ping: its asset and time as strings,
// its coordinates as the JSON text they were sent as, since the module
// forwards pings byte for byte.
func (u *upstream) key(element json.RawMessage) (string, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(element, &members); err != nil {
		return "", err
	}
	asset, err := stringMember(members, u.fields.Asset)
	if err != nil {
		return "", err
	}
	at, err := stringMember(members, u.fields.Time)
	if err != nil {
		return "", err
	}
	lat, lon := members[u.fields.Lat], members[u.fields.Lon]
	if lat == nil || lon == nil {
		return "", fmt.Errorf("no %s or no %s", u.fields.Lat, u.fields.Lon)
	}
	return contentKey(asset, at, string(lat), string(lon)), nil
}

// stringMember returns the string value of the named member.
func stringMember(members map[string]json.RawMessage, name string) (string, error) {
	raw, ok := members[name]
	if !ok {
		return "", fmt.Errorf("no %s", name)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	return s, nil
}
