package ping

import "fmt"

// Presets lists the tracker formats ParsePreset knows.
var Presets = []string{"owntracks", "traccar", "geojson"}

// ParsePreset returns a Parser for a tracker's JSON format; options set
// afterwards override it.
//
//   - owntracks: the OwnTracks app's HTTP mode. Only messages with
//     "_type":"location" are pings; cards, transitions, waypoints and the
//     rest pass through untouched. The asset is the two-letter tracker id
//     "tid", unique only per user: with several users, set the asset to
//     {http.request.header.X-Limit-U}/{http.request.header.X-Limit-D}.
//   - traccar: Traccar's position forwarding (forward.json): the device's
//     uniqueId, or the position's deviceId, and the fix time.
//   - geojson: a GeoJSON Feature with a Point geometry ([lon, lat]), its id
//     in "id" or properties.id, and the time in properties.time or
//     properties.timestamp.
func ParsePreset(name string) (Parser, error) {
	p := NewParser()
	switch name {
	case "owntracks":
		p.AssetPaths, p.TimePaths, p.TimeFormat = []string{"tid"}, []string{"tst"}, TimeUnix
		p.KindPath, p.Kind = "_type", "location"
	case "traccar":
		p.AssetPaths, p.TimePaths, p.TimeFormat = []string{"device.uniqueId", "position.deviceId"}, []string{"position.fixTime"}, TimeRFC3339
		p.LatPath, p.LonPath = "position.latitude", "position.longitude"
	case "geojson":
		p.AssetPaths = []string{"id", "properties.id", "properties.asset_id"}
		p.TimePaths = []string{"properties.time", "properties.timestamp"}
		p.LatPath, p.LonPath = "geometry.coordinates.1", "geometry.coordinates.0"
	default:
		return p, fmt.Errorf("unknown preset %q: use one of %v", name, Presets)
	}
	return p, nil
}
