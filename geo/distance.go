package geo

import "math"

// EarthRadiusM is the authalic Earth radius in metres, the one H3 uses, so
// that distances here and H3's cell sizes are on the same sphere.
const EarthRadiusM = 6371007.180918475

// DistanceM is the haversine distance between two WGS 84 positions, in
// metres. On the scales of GPS jitter and of a vehicle's moves it is within
// 0.5% of the ellipsoidal distance.
func DistanceM(lat1, lon1, lat2, lon2 float64) float64 {
	const rad = math.Pi / 180
	sinLat := math.Sin((lat2 - lat1) * rad / 2)
	sinLon := math.Sin((lon2 - lon1) * rad / 2)
	a := sinLat*sinLat + math.Cos(lat1*rad)*math.Cos(lat2*rad)*sinLon*sinLon
	return 2 * EarthRadiusM * math.Asin(math.Sqrt(a))
}
