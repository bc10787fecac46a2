// Package ping reads telemetry pings out of requests: it splits a body into
// its pings (a single JSON object, a JSON array, NDJSON, the array a
// wrapper object holds), reads form fields and query strings as a JSON
// object (the OsmAnd protocol), picks
// the configured fields of each by path, in the formats of the trackers that
// send them (presets), reads the device time and reprojects the position,
// and checks every rule a ping must keep before it can be keyed. A ping that
// breaks one gets an error naming the field and the rule, for the sender.
//
// It knows nothing of keys, stores or Caddy.
package ping
