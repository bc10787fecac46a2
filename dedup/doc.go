// Package dedup is the Caddy-independent core of telemetry_dedup: it turns a
// JSON telemetry ping into a validated observation, keys it by asset, device
// time bucket and H3 cell, and claims that key atomically in a Store.
//
// The four layers of one request map onto this package as follows:
//
//   - normalise: Parser reads the configured fields and validates them;
//   - quantise: Keyer computes the bucket, the cell and the key;
//   - claim: a Store (MemoryStore or RedisStore) claims the key once;
//   - record: Classify names the decision and its reason.
//
// Nothing here imports Caddy, so the rules can be read and tested alone.
package dedup
