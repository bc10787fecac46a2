package fleetsim

import (
	"math"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
)

const degree = math.Pi / 180

// offset returns the position east and north metres away from lat, lon, in
// the local flat approximation, which is close to exact over the short
// steps of a simulation: a receiver's error, or one interval of driving.
// It moves on geo's sphere, so the distance geo.DistanceM measures between
// two simulated positions is the distance that was put between them.
func offset(lat, lon, east, north float64) (float64, float64) {
	lat2 := lat + north/geo.EarthRadiusM/degree
	lon2 := lon + east/(geo.EarthRadiusM*math.Cos(lat*degree))/degree
	return lat2, geo.WrapLongitude(lon2) // a valid WGS 84 longitude across the antimeridian too
}

// distanceM returns the distance in metres between the reported positions of
// two pings.
func distanceM(a, b Ping) float64 {
	return geo.DistanceM(a.Lat, a.Lon, b.Lat, b.Lon)
}

// roundTo rounds v to the given number of decimals.
func roundTo(v float64, decimals int) float64 {
	scale := math.Pow10(decimals)
	return math.Round(v*scale) / scale
}
