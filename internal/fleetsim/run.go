package fleetsim

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Decider decides deliveries: it is the deduplication under test.
type Decider interface {
	// Deliver makes the delivery and reports, for each of its pings in
	// order, whether it was accepted: whether it reached the backend. An
	// error ends the run.
	Deliver(ctx context.Context, d Delivery) ([]bool, error)
}

// Run generates the deliveries of cfg, makes them through decider in order
// of arrival, and scores the decisions. With cfg.Concurrency above 1,
// different assets' deliveries are made in parallel, each asset's still one
// at a time and in order.
func Run(ctx context.Context, cfg Config, decider Decider) (Score, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return Score{}, err
	}
	f := generate(cfg)
	accepted, err := deliverAll(ctx, f.deliveries, decider, cfg.Concurrency)
	if err != nil {
		return Score{}, err
	}
	return score(cfg, f, accepted), nil
}

// deliverAll makes the deliveries on conns workers. Every asset belongs to
// one worker, which is what keeps its deliveries in order; the workers do
// not wait for each other, since no decision depends on another asset's.
func deliverAll(ctx context.Context, deliveries []Delivery, decider Decider, conns int) ([][]bool, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	accepted := make([][]bool, len(deliveries))
	var wg sync.WaitGroup
	for _, shard := range shardByAsset(deliveries, conns) {
		wg.Go(func() {
			for _, i := range shard {
				ok, err := deliverOne(ctx, decider, deliveries[i])
				if err != nil {
					cancel(fmt.Errorf("delivery %d: %w", i, err))
					return
				}
				accepted[i] = ok
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	return accepted, nil
}

// shardByAsset splits the indices of the deliveries, in order, into at most
// conns shards, dealing the assets out in turn.
func shardByAsset(deliveries []Delivery, conns int) [][]int {
	shards := make([][]int, conns)
	shardOf := map[string]int{}
	for i, d := range deliveries {
		asset := d.Pings[0].Asset
		s, ok := shardOf[asset]
		if !ok {
			s = len(shardOf) % conns
			shardOf[asset] = s
		}
		shards[s] = append(shards[s], i)
	}
	return shards
}

// deliverOne makes one delivery and checks that every ping got a decision.
func deliverOne(ctx context.Context, decider Decider, d Delivery) ([]bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ok, err := decider.Deliver(ctx, d)
	if err != nil {
		return nil, fmt.Errorf("%s, %d pings, arriving %s: %w", d.Pings[0].Asset, len(d.Pings), d.Arrival.Format(time.RFC3339), err)
	}
	if len(ok) != len(d.Pings) {
		return nil, fmt.Errorf("%s: decider answered %d decisions for %d pings", d.Pings[0].Asset, len(ok), len(d.Pings))
	}
	return ok, nil
}
