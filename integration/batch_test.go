package integration

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func postBatch(t *testing.T, client *http.Client, contentType string, body []byte) response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, siteURL, bytes.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return response{res.StatusCode, res.Header, string(b)}
}

// A batch that holds the same ping twice (a sender that queued it twice)
// goes through at once with the ping delivered once, in every shape; were
// the copy answered in flight, every retry of the batch would carry it
// again and the sender would never get the batch through.
func TestABatchHoldingAPingTwiceDeliversItOnce(t *testing.T) {
	for _, shape := range []string{"tumbling", "sliding", "session"} {
		t.Run(shape, func(t *testing.T) {
			up := newUpstream(t)
			tester := startCaddy(t, up, "shape "+shape)
			p := string(ping("veh-twice", base(), 52.5200087, 13.4049547))
			res := postBatch(t, tester.Client, "application/json", []byte("["+p+","+p+"]"))
			res.expect(t, http.StatusCreated, "partial")
			if got := res.header.Get("X-Dedup-Suppressed"); got != "1" || up.count() != 1 || string(up.requests()[0].body) != "["+p+"]" {
				t.Fatalf("suppressed %q; the upstream got %d requests, the first %q", got, up.count(), up.requests()[0].body)
			}
			postBatch(t, tester.Client, "application/json", []byte("["+p+","+p+"]")).expect(t, http.StatusOK, "suppressed")
		})
	}
}

func TestBatchesForwardOnlyTheNewElements(t *testing.T) {
	at := base()
	p := func(asset string, offset time.Duration, lat float64) string {
		return string(ping(asset, at.Add(offset), lat, 13.4049547))
	}
	for _, format := range []struct {
		name, contentType string
		join              func(elements ...string) string
	}{
		{"json array", "application/json", func(e ...string) string { return "[\n  " + strings.Join(e, ",\n  ") + "\n]" }},
		{"ndjson", "application/x-ndjson", func(e ...string) string { return strings.Join(e, "\n") + "\n" }},
	} {
		t.Run(format.name, func(t *testing.T) {
			up := newUpstream(t)
			tester := startCaddy(t, up, "")
			first := []string{p("veh-1", 0, 52.5200087), p("veh-2", 0, 52.5200087), p("veh-3", 0, 52.5200087)}

			// All new: forwarded exactly as sent, whitespace and all.
			body := format.join(first...)
			res := postBatch(t, tester.Client, format.contentType, []byte(body))
			res.expect(t, http.StatusCreated, "accepted")
			if got := up.requests()[0]; string(got.body) != body || got.contentLength != int64(len(body)) {
				t.Fatalf("an all-new batch reached the upstream as %q", got.body)
			}

			// All duplicates: answered here.
			res = postBatch(t, tester.Client, format.contentType, []byte(format.join(first[2], first[0])))
			res.expect(t, http.StatusOK, "suppressed")
			if res.header.Get("X-Dedup-Suppressed") != "2" || up.count() != 1 {
				t.Fatalf("suppressed %s, upstream count %d", res.header.Get("X-Dedup-Suppressed"), up.count())
			}

			// A mix: only the new elements go, each byte for byte, in order.
			invalid := `{"asset_id":"veh-9","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}`
			fresh := []string{p("veh-1", time.Minute, 52.5241000), p("veh-4", 0, 52.5200087)}
			res = postBatch(t, tester.Client, format.contentType, []byte(format.join(first[0], fresh[0], invalid, first[1], fresh[1])))
			res.expect(t, http.StatusCreated, "partial")
			if res.header.Get("X-Dedup-Accepted") != "2" || res.header.Get("X-Dedup-Suppressed") != "2" || res.header.Get("X-Dedup-Rejected") != "1" {
				t.Fatalf("counts %s/%s/%s", res.header.Get("X-Dedup-Accepted"), res.header.Get("X-Dedup-Suppressed"), res.header.Get("X-Dedup-Rejected"))
			}
			var rejections []struct {
				Index       int
				Field, Rule string
			}
			if err := json.Unmarshal([]byte(res.header.Get("X-Dedup-Rejections")), &rejections); err != nil ||
				len(rejections) != 1 || rejections[0].Index != 2 || rejections[0].Field != "occurred_at" || rejections[0].Rule != "timezone" {
				t.Fatalf("rejections header %q (%v)", res.header.Get("X-Dedup-Rejections"), err)
			}
			want := "[" + fresh[0] + "," + fresh[1] + "]"
			if format.name == "ndjson" {
				want = fresh[0] + "\n" + fresh[1] + "\n"
			}
			if got := up.requests()[1]; string(got.body) != want || got.contentLength != int64(len(want)) {
				t.Fatalf("the mixed batch reached the upstream as\n%q\nwant\n%q", got.body, want)
			}
		})
	}
}

// A batch of duplicates beside pings that cannot be keyed is answered as
// delivered, as one of new pings beside them is by its upstream: the
// rejected pings are left out, named in X-Dedup-Rejections. Only a batch
// of nothing but such pings is refused, per element.
func TestBatchOfInvalidPingsAndDuplicatesIsDelivered(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "")
	known := string(ping("veh-k", base(), 52.5200087, 13.4049547))
	post(t, tester.Client, []byte(known)).expect(t, http.StatusCreated, "accepted")
	invalid := `{"asset_id":"x","occurred_at":"` + base().Format(time.RFC3339) + `","lat":91,"lon":1}`
	res := postBatch(t, tester.Client, "application/json", []byte(`[`+known+`,`+invalid+`,"not a ping"]`))
	res.expect(t, http.StatusOK, "partial")
	var rejections []struct {
		Index                 int
		Decision, Field, Rule string
	}
	if err := json.Unmarshal([]byte(res.header.Get("X-Dedup-Rejections")), &rejections); err != nil || len(rejections) != 2 {
		t.Fatalf("X-Dedup-Rejections %q: %v", res.header.Get("X-Dedup-Rejections"), err)
	}
	if r := rejections; r[0].Index != 1 || r[0].Field != "lat" || r[0].Rule != "range" || r[1].Index != 2 || r[1].Rule != "malformed" {
		t.Fatalf("rejections %+v", r)
	}
	if res.header.Get("X-Dedup-Suppressed") != "1" || res.header.Get("X-Dedup-Rejected") != "2" {
		t.Fatalf("counts: suppressed %s, rejected %s", res.header.Get("X-Dedup-Suppressed"), res.header.Get("X-Dedup-Rejected"))
	}

	res = postBatch(t, tester.Client, "application/json", []byte(`[`+invalid+`,"not a ping"]`))
	res.expect(t, http.StatusUnprocessableEntity, "rejected")
	var answer struct {
		Elements []struct {
			Index                         int
			Decision, Reason, Field, Rule string
		}
	}
	if err := json.Unmarshal([]byte(res.body), &answer); err != nil || len(answer.Elements) != 2 {
		t.Fatalf("answer %s: %v", res.body, err)
	}
	if e := answer.Elements; e[0].Field != "lat" || e[0].Rule != "range" || e[1].Decision != "rejected" || e[1].Rule != "malformed" {
		t.Fatalf("elements %+v", e)
	}
	if up.count() != 1 {
		t.Fatalf("upstream saw %d requests", up.count())
	}
}

// A failed upstream gets the claims of every element of the batch back.
func TestBatchReleasesEveryKeyOnUpstreamFailure(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "")
	batch := "[" + string(ping("veh-b1", base(), 52.52, 13.40)) + "," + string(ping("veh-b2", base(), 52.52, 13.40)) + "]"
	up.setResponse(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	postBatch(t, tester.Client, "application/json", []byte(batch)).expect(t, http.StatusServiceUnavailable, "accepted")
	up.setResponse(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	res := postBatch(t, tester.Client, "application/json", []byte(batch))
	res.expect(t, http.StatusCreated, "accepted")
	if res.header.Get("X-Dedup-Accepted") != "2" {
		t.Fatalf("the retry accepted %s elements, want both", res.header.Get("X-Dedup-Accepted"))
	}
}

func TestBatchLimits(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "max_batch 3")
	var elements []string
	for i := range 4 {
		elements = append(elements, string(ping("veh-limit", base().Add(time.Duration(i)*time.Minute), 52.52, 13.40)))
	}
	postBatch(t, tester.Client, "application/json", []byte("["+strings.Join(elements, ",")+"]")).expect(t, http.StatusRequestEntityTooLarge, "rejected")
	postBatch(t, tester.Client, "application/x-ndjson", []byte(strings.Join(elements, "\n"))).expect(t, http.StatusRequestEntityTooLarge, "rejected")
	postBatch(t, tester.Client, "application/json", []byte("[]")).expect(t, http.StatusBadRequest, "rejected")
	if up.count() != 0 {
		t.Fatalf("upstream saw %d requests", up.count())
	}
}
