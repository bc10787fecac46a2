package ping

import "fmt"

// Presets lists the tracker formats ParsePreset knows.
var Presets = []string{"owntracks", "overland", "osmand", "traccar", "geojson"}

// Preset is a tracker's format: how its bodies hold pings and where each
// ping's fields are.
type Preset struct {
	// Parser reads its JSON pings.
	Parser Parser
	// Form, when the format also sends form fields (a URL query or a form
	// body), reads those; their JSON-shaped bodies are for Parser.
	Form *Parser
	// Wrapper is the path of the array an object body holds its pings in,
	// if the format wraps them.
	Wrapper string
	// Collection is the member of a collection object that holds its
	// pings, when the format has one that is not read unless set as the
	// wrapper (GeoJSON's FeatureCollection); see Splitter.Collection.
	Collection string
}

// ParsePreset returns a tracker's format; options set afterwards override
// it.
//
//   - owntracks: the OwnTracks app's HTTP mode. Only messages with
//     "_type":"location" are pings; cards, transitions, waypoints, empty
//     bodies and the rest pass through untouched. The asset is the
//     two-letter tracker id "tid", unique only per user: with several
//     users, set the asset to topic, owntracks/<user>/<device>, which
//     both apps always send (Android sends the X-Limit-U header only once
//     a username is set). A location whose tid is empty or blank (Android
//     keeps only the letters and digits of the setting, so a tid typed as
//     "--" or an emoji is sent as ""; iOS sends the setting as typed, a
//     space too) is keyed by its topic: refused, Android retried it at the
//     head of its queue for weeks and iOS deleted it. A
//     location the user published by hand (trigger t u), that answers a
//     reportLocation command (r), that a region (c) or beacon (b) event
//     sent, or that publishes the last fix again on the app's ping
//     schedule (p), is an event, told apart from another at the same fix
//     by its created_at. A location at (0, 0) or beyond MaxFuture or
//     MaxPast goes on unkeyed, as the Recorder stores it.
//   - overland: Overland's batches, {"locations":[Feature...], ...}; each
//     Feature a ping, its visits, trip summaries, logged actions and fixes
//     iOS marks invalid not positions. The asset is properties.device_id,
//     else properties.unique_id; the app may leave both out: take it from
//     the request instead. A fix at (0, 0) or
//     beyond MaxFuture or MaxPast goes on unkeyed, as its backends store
//     it.
//   - osmand: the OsmAnd protocol of Traccar's port 5055, as Traccar Client
//     and OsmAnd send it: form fields (id or deviceid, lat, lon,
//     timestamp, speed in knots, accuracy, alarm, ignition, valid, ...),
//     and the Transistorsoft SDK's JSON body that the same port takes.
//   - traccar: Traccar's position forwarding (forward.type=json): the
//     device's uniqueId, or the position's deviceId, and the device's
//     time of the message (deviceTime, else fixTime).
//     Its event forwarding's bodies ({"event":...}) pass through untouched.
//   - geojson: a GeoJSON Feature with a Point geometry ([lon, lat]), its id
//     in "id", properties.id or properties.asset_id, and the time in
//     properties.time or properties.timestamp. A FeatureCollection is
//     refused unless its features are set as the batch wrapper.
func ParsePreset(name string) (Preset, error) {
	switch name {
	case "owntracks":
		return Preset{Parser: ownTracks()}, nil
	case "overland":
		return Preset{Parser: overland(), Wrapper: "locations"}, nil
	case "osmand":
		form := osmAnd()
		return Preset{Parser: transistorsoft(), Form: &form}, nil
	case "traccar":
		return Preset{Parser: traccarForward()}, nil
	case "geojson":
		p := NewParser()
		p.AssetPaths = []string{"id", "properties.id", "properties.asset_id"}
		p.TimePaths = []string{"properties.time", "properties.timestamp"}
		p.LatPath, p.LonPath = "geometry.coordinates.1", "geometry.coordinates.0"
		return Preset{Parser: p, Collection: "features"}, nil
	}
	return Preset{}, fmt.Errorf("unknown preset %q: use one of %v", name, Presets)
}

func ownTracks() Parser {
	p := NewParser()
	p.AssetPaths, p.TimePaths, p.TimeFormat = []string{"tid", "topic"}, []string{"tst"}, TimeUnix
	p.KindPath, p.Kind, p.SkipEmpty = "_type", "location", true
	p.AccuracyPath, p.SpeedPath, p.SpeedUnit = "acc", "vel", KilometresPerHour
	// A ping (p) publishes the fix the app last published again, its tst
	// and coordinates unchanged (Android's SendLocationPingWorker, every
	// 15 minutes at least, through LocationProcessor.publishLocationMessage;
	// a fresh fix with the experimental high-accuracy ping, once a ping too):
	// keyed as that fix, a parked phone's pings were redeliveries for the
	// whole TTL, and in HTTP mode, where friends and queued commands come
	// only in the answer to a post, it heard nothing for hours.
	p.Events = []Match{{Path: "t", Values: []string{"u", "r", "c", "b", "p"}}}
	// The iOS app publishes a point of interest, a tag or a photo as a
	// manual location at the fix it last had, and both apps publish each
	// region's enter and leave at the fix of the transition: the same fix
	// and trigger, another message. created_at is when the app made the
	// message: a queued one keeps it through every retry, and a ping, a
	// second press of publish or a second reportLocation at one fix is
	// another message.
	p.EventDetails = []string{"poi", "tag", "imagename", "inregions", "created_at"}
	// The Recorder stores a location whatever its tst (a phone whose clock
	// runs fast), and Android resends a refused one at the head of its
	// queue until it goes through, while iOS deletes it.
	p.PassImplausible = true
	return p
}

func overland() Parser {
	p := NewParser()
	// The app writes device_id only once the user typed one; with "Include
	// Unique ID" on (or unique_id=yes in its setup link) every record
	// carries unique_id, the phone's identifierForVendor (GLManager.m,
	// addMetadataToUpdate), which Overland's README offers as the way to
	// tell devices apart.
	p.AssetPaths, p.TimePaths = []string{"properties.device_id", "properties.unique_id"}, []string{"properties.timestamp"}
	p.LatPath, p.LonPath = "geometry.coordinates.1", "geometry.coordinates.0"
	p.AccuracyPath, p.SpeedPath, p.SpeedUnit = "properties.horizontal_accuracy", "properties.speed", MetresPerSecond
	// Visits, trip summaries and logged actions share the array with the
	// fixes, often in the same second as one. A fix iOS marks invalid (a
	// negative horizontal_accuracy: its coordinates mean nothing, often a
	// stale place kilometres off) is queued as any other, and keyed it
	// was taken for a departure and the fixes at home after it suppressed.
	p.Skip = []Match{{Path: "properties.action"}, {Path: "properties.type", Values: []string{"trip"}},
		{Path: "properties.horizontal_accuracy", Negative: true}}
	// Its backends store a fix whatever its time, and Overland resends a
	// batch not answered {"result":"ok"} whole, at every send interval.
	p.PassImplausible = true
	return p
}

// osmAnd reads the OsmAnd protocol's fields as Traccar's OsmAndProtocolDecoder
// does, the position from lat and lon or from location=lat,lon. A request
// with neither (a cell or Wi-Fi report, to which Traccar gives the last
// known position) or without timestamp (Traccar then takes its own clock)
// carries no fix to key, and one whose valid is neither true (in any
// letter case) nor 1 a position the device itself calls invalid: they go
// to Traccar as they came.
func osmAnd() Parser {
	p := NewParser()
	p.AssetPaths, p.TimePaths = []string{"id", "deviceid"}, []string{"timestamp"}
	p.AssetAliases = true
	p.PairField = "location"
	p.AccuracyPath, p.SpeedPath, p.SpeedUnit = "accuracy", "speed", Knots
	// The OsmAnd app has no accuracy field: the live tracking URL Traccar
	// documents for it (...&hdop={3}...) sends the fix's accuracy, in
	// metres, as hdop (LiveMonitoringHelper). A true HDOP, a few units,
	// read as metres widens nothing: it is below any radius.
	p.AccuracyFallback = "hdop"
	p.Events = []Match{{Path: "alarm"}}
	// An alarm is a state too, and its absence one: Traccar raises an
	// alarm only when the device's last stored position did not carry it
	// (event.ignoreDuplicateAlerts, on by default), so the first position
	// without it must reach Traccar, or a parked phone's second SOS
	// raised nothing.
	p.States = []string{"ignition", "driverUniqueId", "alarm"}
	p.ClearedWhenAbsent = []string{"alarm"}
	p.Skip = []Match{{Path: "lat", Absent: true}, {Path: "timestamp", Absent: true}, {Path: "valid", Values: []string{"true", "1"}, Except: true}}
	// Traccar stores a position whatever its time (its filter is off by
	// default), and the old Traccar Client retries a refused one forever
	// at the head of its queue.
	p.PassImplausible = true
	p.FromForm = true
	return p
}

// transistorsoft reads the Transistorsoft SDK's body that Traccar's OsmAnd
// port takes as JSON: {"location":{...},"device_id":...}.
func transistorsoft() Parser {
	p := NewParser()
	p.AssetPaths, p.TimePaths, p.TimeFormat = []string{"device_id"}, []string{"location.timestamp"}, TimeRFC3339
	p.LatPath, p.LonPath = "location.coords.latitude", "location.coords.longitude"
	p.AccuracyPath, p.SpeedPath, p.SpeedUnit = "location.coords.accuracy", "location.coords.speed", MetresPerSecond
	p.Events = []Match{{Path: "location.alarm"}, {Path: "location.extras.alarm"}, {Path: "location.event", Values: []string{"geofence"}}}
	p.States = []string{"location.is_moving", "location.alarm", "location.extras.alarm"} // the alarm as osmAnd's
	p.ClearedWhenAbsent = []string{"location.alarm", "location.extras.alarm"}
	// Without coords Traccar takes the device's last known position.
	p.Skip = []Match{{Path: "location.coords", Absent: true}}
	p.PassImplausible = true // as osmAnd's, for the same Traccar
	return p
}

// traccarForward reads what Traccar's JSON position forwarder posts. The
// events and states are the attributes Traccar's own event handlers act on
// at a single position: an alarm, a command's result and attached media
// are events; the ignition and the driver are states. Its motion is not: a
// parked vehicle's GPS speed noise flips it, and Traccar debounces trips
// and stops over minutes anyway.
func traccarForward() Parser {
	p := NewParser()
	// A status message without a fix of its own (a heartbeat with the
	// ignition, an alarm from a garage) comes as a position that repeats
	// the last fix's fixTime and coordinates (Traccar's OutdatedHandler) at
	// its own deviceTime; every other position has both times the fix's.
	// Judged by fixTime, each such status was a redelivery of that fix.
	p.AssetPaths, p.TimePaths = []string{"device.uniqueId", "position.deviceId"}, []string{"position.deviceTime", "position.fixTime"}
	p.LatPath, p.LonPath = "position.latitude", "position.longitude"
	p.AccuracyPath, p.SpeedPath, p.SpeedUnit = "position.accuracy", "position.speed", Knots
	// A Transistorsoft geofence crossing comes as the event attribute
	// Traccar's OsmAnd decoder copies from location.event, as the osmand
	// preset reads it; other protocols write their own event codes there,
	// numbers sent with routine positions.
	p.Events = []Match{{Path: "position.attributes.alarm"}, {Path: "position.attributes.result"},
		{Path: "position.attributes.image"}, {Path: "position.attributes.video"}, {Path: "position.attributes.audio"},
		{Path: "position.attributes.event", Values: []string{"geofence"}}}
	p.States = []string{"position.attributes.ignition", "position.attributes.driverUniqueId"}
	// A position the device marks invalid carries no fix (often its last
	// known coordinates): forwarded as it came, never keyed. So is what
	// Traccar's event forwarder (event.forward.url) posts, when it shares
	// the endpoint: an event with the position it happened at, which the
	// position forwarder has sent already. Keyed, it would be that
	// position's redelivery, and Traccar never resends a lost event.
	p.Skip = []Match{{Path: "position.valid", Values: []string{"false"}}, {Path: "event"}}
	// Traccar stored the position whatever its time or place (a device
	// whose clock is off, a new device's first message at (0, 0)), and the
	// forwarder drops what it is refused.
	p.PassImplausible = true
	// Its default forward.type, url, GETs a URL template without a body.
	p.EmptyFix = "Traccar's position forwarder sends a body only with forward.type json; " +
		"its default, url, sends a GET without one: set <entry key='forward.type'>json</entry> in traccar.xml"
	return p
}
