package fleetsim

import (
	"math"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
)

// earthRadiusM is the mean Earth radius (IUGG). Moving a position and
// measuring a distance use the same sphere, so the distance measured between
// two simulated positions is the distance that was put between them.
const earthRadiusM = 6371008.8

const degree = math.Pi / 180

// offset returns the position east and north metres away from lat, lon, in
// the local flat approximation, which is close to exact over the short
// steps of a simulation: a receiver's error, or one interval of driving.
func offset(lat, lon, east, north float64) (float64, float64) {
	lat2 := lat + north/earthRadiusM/degree
	lon2 := lon + east/(earthRadiusM*math.Cos(lat*degree))/degree
	return lat2, geo.WrapLongitude(lon2) // a valid WGS 84 longitude across the antimeridian too
}

// haversineM returns the great-circle distance in metres between two
// positions in degrees.
func haversineM(lat1, lon1, lat2, lon2 float64) float64 {
	dLat := (lat2 - lat1) * degree
	dLon := (lon2 - lon1) * degree
	h := math.Pow(math.Sin(dLat/2), 2) +
		math.Cos(lat1*degree)*math.Cos(lat2*degree)*math.Pow(math.Sin(dLon/2), 2)
	return 2 * earthRadiusM * math.Asin(math.Min(1, math.Sqrt(h)))
}

// distanceM returns the distance in metres between the reported positions of
// two pings.
func distanceM(a, b Ping) float64 {
	return haversineM(a.Lat, a.Lon, b.Lat, b.Lon)
}

// roundTo rounds v to the given number of decimals.
func roundTo(v float64, decimals int) float64 {
	scale := math.Pow10(decimals)
	return math.Round(v*scale) / scale
}
