// Package geo is the geodesy telemetry_dedup needs: reprojection of
// positions reported in a projected coordinate system to WGS 84, and
// distances on the Earth's surface. It knows nothing of pings or keys.
package geo
