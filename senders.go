package telemetrydedup

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/dustin/go-humanize"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// Answers sets the answers the handler gives itself. What a sender's
// client counts as delivered, as "retry later" and as "drop it" differs
// per client (OwnTracks Android re-queues any 2xx whose body is not
// OwnTracks JSON, Overland any answer without "result":"ok", OwnTracks iOS
// deletes a message on any 4xx): each answer given here replaces the
// preset's.
type Answers struct {
	// Suppressed answers a duplicate, alone or a batch of only
	// duplicates: the sender must count it as delivered.
	Suppressed *Answer `json:"suppressed,omitempty"`
	// InFlight answers an exact redelivery whose first delivery still
	// waits for its upstream: the sender must try again later.
	InFlight *Answer `json:"in_flight,omitempty"`
	// DeadLettered answers a ping kept in the dead-letter stream: the
	// sender must count it as delivered and stop sending it.
	DeadLettered *Answer `json:"dead_lettered,omitempty"`
}

// Answer is one answer the handler gives itself.
type Answer struct {
	// Status is the HTTP status: 2xx for suppressed and dead_lettered,
	// 4xx or 5xx for in_flight. Required.
	Status int `json:"status,omitempty"`
	// ContentType is the answer's Content-Type (suppressed and
	// dead_lettered only; dead_lettered only with a Body, since without
	// one it answers the JSON report as application/json).
	ContentType string `json:"content_type,omitempty"`
	// Body is the answer's body (suppressed and dead_lettered only).
	// Unset: empty for suppressed, the JSON report naming the field and
	// rule for dead_lettered.
	Body *string `json:"body,omitempty"`
	// RetryAfter is the Retry-After of an in_flight answer, in whole
	// seconds, at least 1 (OkHttp, in OwnTracks Android, resends a 503
	// with Retry-After: 0 at once) and at most 3600. Default: 1.
	RetryAfter int `json:"retry_after,omitempty"`
}

// maxRetryAfter is the longest Retry-After an in_flight answer may ask
// for, in seconds.
const maxRetryAfter = 3600

// answers are the handler's own answers, resolved.
type answers struct {
	suppressed, deadLettered bodyAnswer
	inFlight                 retryAnswer
}

// bodyAnswer is a 2xx the sender takes as delivered. Without a body of its
// own, a suppression is empty and a dead letter the JSON report.
type bodyAnswer struct {
	status      int
	contentType string
	body        []byte
	hasBody     bool
}

// retryAnswer asks the sender to come back; its body is the JSON report.
type retryAnswer struct {
	status     int
	retryAfter string
}

// defaultAnswers are the design's (README, Decisions): 200 and an empty body for a duplicate,
// 409 and Retry-After: 1 for an in-flight redelivery.
var defaultAnswers = answers{
	suppressed:   bodyAnswer{status: http.StatusOK},
	deadLettered: bodyAnswer{status: http.StatusAccepted},
	inFlight:     retryAnswer{status: http.StatusConflict, retryAfter: "1"},
}

// presetAnswers are the answers each sender's client reads as meant, from
// the clients' own source (see README, "What each client counts as
// delivered"). Every client retries a 503; none may see a 4xx for "later":
// OwnTracks iOS deletes the message and alerts the user.
var presetAnswers = map[string]answers{
	// Android 2.5.7-2.5.9 parses every 2xx body as OwnTracks messages and
	// re-queues it forever when it cannot; [] is what the booklet's server
	// answers.
	"owntracks": senderAnswers("application/json", "[]"),
	// GLManager.m deletes a batch only on a JSON object with "result":"ok".
	"overland": senderAnswers("application/json", `{"result":"ok"}`),
	// Traccar's own OsmAnd port answers 200 with an empty body. Traccar
	// Client 9 (the Transistorsoft SDK 4.x) deletes a record only on 200,
	// 201 or 204, so a dead letter is a 200 here, still the JSON report.
	"osmand": {suppressed: defaultAnswers.suppressed, deadLettered: bodyAnswer{status: http.StatusOK}, inFlight: retryLater},
	// Traccar's forwarder takes any 2xx, and retries a failure only with
	// forward.retry.enable.
	"traccar": {suppressed: defaultAnswers.suppressed, deadLettered: defaultAnswers.deadLettered, inFlight: retryLater},
}

// ownTracksMinBody is the smallest max_body every OwnTracks message fits.
// The apps post each message whole, one a request, and the largest are not
// locations, which pass through untouched but are read first: an iOS card,
// a 192×192 PNG in base64 that is at most about 197 KB
// (CreateCardTVC.swift), a location with a photo (AttachPhotoTVC.swift), and
// Android's waypoints export, about 100 bytes a region
// (LocationProcessor.publishWaypointsMessage). Android re-queues a refused
// message at the head of its queue for good (MessageProcessor.kt), so a
// 413 for one stops every later location of the phone.
const ownTracksMinBody = 256 << 10

// checkMaxBody refuses a max_body that the preset's client would meet a
// 413 with for a message it cannot make smaller.
func checkMaxBody(preset string, maxBody int64) error {
	if preset != "owntracks" || maxBody >= ownTracksMinBody {
		return nil
	}
	return &dedup.ConfigError{Option: "max_body", Problem: fmt.Sprintf(
		"%d bytes is below the %d (%s) that OwnTracks' largest messages need: an iOS card's photo, a location with a photo, "+
			"Android's list of regions. They pass through untouched but are read first, and OwnTracks Android resends a "+
			"refused message forever at the head of its queue, so one 413 would stop every later location of the phone; "+
			"set max_body %dKiB or more (%d in JSON), or leave it out for the default %dMiB",
		maxBody, ownTracksMinBody, humanize.IBytes(ownTracksMinBody), ownTracksMinBody>>10, ownTracksMinBody, defaultMaxBody>>20)}
}

// overlandLargestBatch is the most Features Overland posts in one batch:
// its Locations per Batch setting offers 50, 100, 200 (the default), 500
// and 1000 (GLManager.m, pointsPerBatch and the batch_size it takes from a
// server's "set"). A batch refused is resent whole at every send interval.
const overlandLargestBatch = 1000

// overlandDefaultBatch is Overland's Locations per Batch out of the box.
const overlandDefaultBatch = 200

// retryLater is the in-flight answer every client of the presets retries.
var retryLater = retryAnswer{status: http.StatusServiceUnavailable, retryAfter: "1"}

func senderAnswers(contentType, body string) answers {
	delivered := func(status int) bodyAnswer {
		return bodyAnswer{status: status, contentType: contentType, body: []byte(body), hasBody: true}
	}
	return answers{suppressed: delivered(http.StatusOK), deadLettered: delivered(http.StatusAccepted), inFlight: retryLater}
}

// resolveAnswers starts from the preset's answers and replaces those the
// option gives.
func (h *Handler) resolveAnswers() (answers, error) {
	a, ok := presetAnswers[h.Preset]
	if !ok {
		a = defaultAnswers
	}
	if h.Answers == nil {
		return a, nil
	}
	var err error
	if h.Answers.Suppressed != nil {
		if a.suppressed, err = h.Answers.Suppressed.delivered("suppressed"); err != nil {
			return a, err
		}
	}
	if h.Answers.DeadLettered != nil {
		if a.deadLettered, err = h.Answers.DeadLettered.delivered("dead_lettered"); err != nil {
			return a, err
		}
	}
	if h.Answers.InFlight != nil {
		if a.inFlight, err = h.Answers.InFlight.retry(); err != nil {
			return a, err
		}
	}
	return a, nil
}

// misreadAnswers lists each answer given beside a preset that the preset's
// client does not read as its kind means, with what the client does
// instead: the handler warns of them at load. They are not refused, as a
// route may serve one client the preset does not name (Overland in its
// OwnTracks mode counts only {"result":"ok"} as delivered, which OwnTracks
// Android resends forever).
func (h *Handler) misreadAnswers() []string {
	if h.Answers == nil {
		return nil
	}
	var misread []string
	for _, given := range []struct {
		kind   string
		answer *Answer
	}{{"suppressed", h.Answers.Suppressed}, {"dead_lettered", h.Answers.DeadLettered}} {
		if given.answer == nil {
			continue
		}
		if what := deliveredMisread(h.Preset, given.answer); what != "" {
			misread = append(misread, given.kind+": "+what)
		}
	}
	if a := h.Answers.InFlight; a != nil && h.Preset == "owntracks" && a.Status < 500 {
		misread = append(misread, fmt.Sprintf("in_flight: OwnTracks iOS deletes a message answered %d (any 4xx) and alerts the user; "+
			"use a 5xx such as 503", a.Status))
	}
	return misread
}

// deliveredMisread says what preset's client does with a suppressed or
// dead_lettered answer it does not count as delivered, or "" if it does
// (see README, "Senders: what each client counts as delivered").
func deliveredMisread(preset string, a *Answer) string {
	var body any // nil unless the body is JSON
	if a.Body != nil {
		// Without a byte order mark, as OkHttp (OwnTracks Android) and
		// NSJSONSerialization (Overland) read it.
		_ = json.Unmarshal(bytes.TrimPrefix([]byte(*a.Body), []byte("\ufeff")), &body)
	}
	switch preset {
	case "owntracks":
		if !ownTracksMessages(body) {
			return "OwnTracks Android 2.5.7 to 2.5.9 reads a 2xx's body as OwnTracks messages, [] or messages whose _type it knows, " +
				"and resends the message forever at the head of its queue when it cannot; answer 200 application/json []"
		}
		if typ, does := ownTracksActsOn(body); typ != "" {
			return fmt.Sprintf("OwnTracks Android acts on a %q message in every answer that carries it (MessageProcessor.kt): it %s "+
				"at every duplicate answered so; answer 200 application/json []", typ, does)
		}
	case "overland":
		object, _ := body.(map[string]any)
		result, _ := object["result"].(string)
		_, geocodeObject := object["geocode"].(map[string]any)
		if result != "ok" || !overlandReadsJSON(a.ContentType) || object["geocode"] != nil && !geocodeObject {
			return `Overland keeps and resends the whole batch unless the answer is a JSON object with "result":"ok" as application/json, ` +
				`and crashes on a "result" that is no string or a "geocode" that is no object (GLManager.m); ` +
				`answer 200 application/json {"result":"ok"}`
		}
	case "osmand":
		if a.Status != http.StatusOK && a.Status != http.StatusCreated && a.Status != http.StatusNoContent {
			return fmt.Sprintf("Traccar Client 9 (the Transistorsoft SDK 4.x) deletes a record only on 200, 201 or 204, "+
				"and uploads one answered %d again at every sync; answer 200", a.Status)
		}
	}
	return ""
}

// ownTracksTypes are the _type values OwnTracks Android 2.5.7 to 2.5.9
// decodes (Parser.kt); any other fails the whole answer. An "encrypted"
// one does too, unless the phone has the key.
var ownTracksTypes = map[string]bool{"card": true, "clear": true, "cmd": true, "configuration": true, "location": true,
	"lwt": true, "status": true, "transition": true, "waypoint": true, "waypoints": true}

// ownTracksMessages reports a JSON body OwnTracks Android reads: an array
// of messages (none included), or one message.
func ownTracksMessages(body any) bool {
	messages, isArray := body.([]any)
	if !isArray {
		messages = []any{body}
	}
	for _, m := range messages {
		object, _ := m.(map[string]any)
		if typ, _ := object["_type"].(string); !ownTracksTypes[typ] {
			return false
		}
	}
	return true
}

// ownTracksActions is what OwnTracks Android does on each incoming message
// of a _type it acts on, rather than keeps as a contact's state
// (MessageProcessor.processIncomingMessage).
var ownTracksActions = map[string]string{
	"cmd": "runs the command (remote commands are on by default): a reportLocation one has the phone report again, " +
		"and a parked phone's report is suppressed again, with the same answer",
	"transition": "notifies the user of the region event",
	"clear":      "removes the contact it names",
}

// ownTracksActsOn returns the first message of a body ownTracksMessages
// reads whose _type OwnTracks Android acts on, and what it does.
func ownTracksActsOn(body any) (typ, does string) {
	messages, isArray := body.([]any)
	if !isArray {
		messages = []any{body}
	}
	for _, m := range messages {
		object, _ := m.(map[string]any)
		typ, _ := object["_type"].(string)
		if does, acts := ownTracksActions[typ]; acts {
			return typ, does
		}
	}
	return "", ""
}

// overlandReadsJSON reports a content type Overland's response serializer
// (AFNetworking's AFJSONResponseSerializer) parses; it fails the request
// on any other.
func overlandReadsJSON(contentType string) bool {
	ct := mediaType(contentType)
	return ct.is("application/json") || ct.is("text/json") || ct.is("text/javascript")
}

// check reports an answer of the kind that would not have the effect its
// kind needs.
func (a *Answer) check(kind string) error {
	var err error
	if kind == "in_flight" {
		_, err = a.retry()
	} else {
		_, err = a.delivered(kind)
	}
	return err
}

// delivered checks an answer that must tell the sender it is done.
func (a *Answer) delivered(kind string) (bodyAnswer, error) {
	noContent := carriesNoContent(a.Status)
	switch {
	case a.Status == 0:
		return bodyAnswer{}, answerError(kind, "status 0 (or none) is no HTTP status; give one, such as 200")
	case a.Status < 200 || a.Status > 299:
		// 200, which every preset's client counts as delivered (Traccar
		// Client 9 does not count a 202).
		return bodyAnswer{}, answerError(kind, "status %d is not a 2xx: the sender would resend the ping, and have it %s again, forever; "+
			"use a 2xx such as 200", a.Status, kind)
	case a.RetryAfter != 0:
		return bodyAnswer{}, answerError(kind, "retry_after belongs to in_flight: a %s ping must not come back", kind)
	case noContent && a.Body != nil && *a.Body != "":
		return bodyAnswer{}, answerError(kind, "status %d carries no body; drop the body or use 200", a.Status)
	case noContent: // the rules below are for a body a client reads
	case kind == "dead_lettered" && a.ContentType != "" && a.Body == nil:
		return bodyAnswer{}, answerError(kind, "content type %q without a body: the answer is then the JSON report, "+
			"sent as application/json; give a body too, or drop the content type", a.ContentType)
	case mediaType(a.ContentType).json() && (a.Body == nil || !json.Valid([]byte(*a.Body))):
		body := "is missing"
		if a.Body != nil {
			body = fmt.Sprintf("%q is not JSON", *a.Body)
		}
		return bodyAnswer{}, answerError(kind, "content type %s says JSON, and the body %s: a client that reads the answer would not take it "+
			"for delivered (OwnTracks Android wants [], Overland {\"result\":\"ok\"}) and resend the ping; give a JSON body, or another content type", a.ContentType, body)
	}
	b := bodyAnswer{status: a.Status, contentType: a.ContentType, hasBody: a.Body != nil}
	if b.hasBody {
		b.body = []byte(*a.Body)
	}
	return b, nil
}

// retry checks an answer that must make the sender come back.
func (a *Answer) retry() (retryAnswer, error) {
	switch {
	case a.Status == 0:
		return retryAnswer{}, answerError("in_flight", "status 0 (or none) is no HTTP status; give one, such as 503")
	case a.Status < 400 || a.Status > 599:
		return retryAnswer{}, answerError("in_flight", "status %d does not make a sender retry: use a 5xx such as 503, "+
			"which every client retries (a 4xx makes OwnTracks iOS delete the message)", a.Status)
	case a.ContentType != "" || a.Body != nil:
		return retryAnswer{}, answerError("in_flight", "the body of an in_flight answer is the JSON report of what is in flight; give only the status and retry_after")
	case a.RetryAfter < 0:
		return retryAnswer{}, answerError("in_flight", "retry_after %d is negative; use at least 1 second", a.RetryAfter)
	case a.RetryAfter > maxRetryAfter:
		return retryAnswer{}, answerError("in_flight", "retry_after %d is over an hour (%d s): a claim is in flight for in_flight_timeout at most, "+
			"and a sender that honours it would hold its queue that long; use a few seconds, such as 1", a.RetryAfter, maxRetryAfter)
	}
	after := a.RetryAfter
	if after == 0 {
		after = 1 // never 0: OkHttp resends a 503 with Retry-After: 0 at once
	}
	return retryAnswer{status: a.Status, retryAfter: strconv.Itoa(after)}, nil
}

func answerError(kind, format string, args ...any) error {
	return &dedup.ConfigError{Option: "answers", Problem: kind + ": " + fmt.Sprintf(format, args...)}
}
