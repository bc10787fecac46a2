// Package dedup is the claim core of telemetry_dedup: it quantises a
// validated ping (package ping) into its bucket, H3 cell and key
// (tumbling), or into its asset's track (sliding and session), judges it
// by the window shape, and claims it atomically in a Store, so that each
// observation of a moving asset is let through once.
//
// The four layers of one request map onto the packages as follows:
//
//   - normalise: ping.Parser reads the configured fields and validates them;
//   - quantise: Keyer computes the bucket, the cell and the key, or, in
//     sliding and session, the track and seen-set keys the stay is judged
//     by;
//   - claim: a Store (MemoryStore or RedisStore, optionally behind a
//     NearCache and a Breaker) claims the key once, in one round trip;
//   - record: the Verdict names the decision and its reason, and a
//     StuckTracker watches each asset's verdicts.
//
// Nothing here imports Caddy, so the rules can be read and tested alone.
package dedup
