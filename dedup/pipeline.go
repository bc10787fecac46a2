package dedup

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Pipeline sends the Redis commands of concurrent requests together. A
// request hands over its commands and waits; a writer takes everything that
// is waiting, sends it as one pipeline (one round trip), and hands each
// request its results. Under load, many requests share each round trip;
// when a request comes alone, the writer sends it at once, so nothing waits
// for a batch to fill. go-redis splits a pipeline per node on a Cluster, so
// each node gets one round trip per batch.
//
// One Pipeline serves every store on one Redis connection.
type Pipeline struct {
	client redis.UniversalClient
	jobs   chan *pipelineJob
	stop   chan struct{}
	wg     sync.WaitGroup

	roundTrips, commands atomic.Uint64
}

// pipelineWriters is how many pipelines may be in flight at once: two let
// one batch cross the network while the next is gathered, and keep batches
// large.
const pipelineWriters = 2

// maxPipeline caps the commands of one round trip.
const maxPipeline = 512

// pipelineJob is one request's commands.
type pipelineJob struct {
	cmds     []pipelineCmd
	deadline time.Time
	done     chan error // receives nil or the first command error
}

// pipelineCmd is one command: a plain one (queue only), or a script, which
// is sent as EVALSHA and loaded once if Redis does not know it yet.
type pipelineCmd struct {
	queue  func(ctx context.Context, p redis.Pipeliner) redis.Cmder
	script *redis.Script
	cmd    redis.Cmder // after the round trip
}

// NewPipeline starts the writers for client. Close stops them.
func NewPipeline(client redis.UniversalClient) *Pipeline {
	p := &Pipeline{client: client, jobs: make(chan *pipelineJob, maxPipeline), stop: make(chan struct{})}
	for range pipelineWriters {
		p.wg.Go(p.write)
	}
	return p
}

// Close stops the writers once the requests they hold are answered.
func (p *Pipeline) Close() {
	close(p.stop)
	p.wg.Wait()
}

// RoundTrips returns how many pipelines were sent, and how many commands
// they carried, since the Pipeline started.
func (p *Pipeline) RoundTrips() (roundTrips, commands uint64) {
	return p.roundTrips.Load(), p.commands.Load()
}

// do runs cmds in one round trip (shared with other requests) and returns
// the first command error; redis.Nil, an absent key, is not one. It gives
// up when ctx ends.
func (p *Pipeline) do(ctx context.Context, cmds []pipelineCmd) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	job := &pipelineJob{cmds: cmds, deadline: deadline, done: make(chan error, 1)}
	select {
	case p.jobs <- job:
	case <-ctx.Done():
		return ctx.Err()
	case <-p.stop:
		return errors.New("the Redis store is closed")
	}
	select {
	case err := <-job.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *Pipeline) write() {
	for {
		select {
		case job := <-p.jobs:
			p.send(p.gather(job))
		case <-p.stop:
			return
		}
	}
}

// gather takes job and whatever else is waiting, up to maxPipeline
// commands, without waiting for more.
func (p *Pipeline) gather(job *pipelineJob) []*pipelineJob {
	batch, n := []*pipelineJob{job}, len(job.cmds)
	for n < maxPipeline {
		select {
		case next := <-p.jobs:
			batch = append(batch, next)
			n += len(next.cmds)
		default:
			return batch
		}
	}
	return batch
}

// send runs a batch as one pipeline, with the latest deadline among its
// jobs (each job's caller still gives up at its own), then once more for
// the scripts Redis did not know yet.
func (p *Pipeline) send(batch []*pipelineJob) {
	latest := batch[0].deadline
	for _, job := range batch {
		if job.deadline.After(latest) {
			latest = job.deadline
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), latest)
	defer cancel()

	p.exec(ctx, batch, func(*pipelineCmd) bool { return true })
	if scripts := unknownScripts(batch); len(scripts) > 0 {
		for _, s := range scripts {
			s.Load(ctx, p.client) // a Cluster client loads it on every master
		}
		p.exec(ctx, batch, func(c *pipelineCmd) bool { return isNoScript(c.cmd.Err()) })
	}
	for _, job := range batch {
		job.done <- job.err()
	}
}

// exec sends the commands that want says need sending, as one pipeline.
func (p *Pipeline) exec(ctx context.Context, batch []*pipelineJob, want func(*pipelineCmd) bool) {
	pipe := p.client.Pipeline()
	n := 0
	for _, job := range batch {
		for i := range job.cmds {
			if c := &job.cmds[i]; want(c) {
				c.cmd = c.queue(ctx, pipe)
				n++
			}
		}
	}
	if n == 0 {
		return
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	p.roundTrips.Add(1)
	p.commands.Add(uint64(n))
}

func unknownScripts(batch []*pipelineJob) []*redis.Script {
	var scripts []*redis.Script
	for _, job := range batch {
		for _, c := range job.cmds {
			if c.script != nil && isNoScript(c.cmd.Err()) && !slices.Contains(scripts, c.script) {
				scripts = append(scripts, c.script)
			}
		}
	}
	return scripts
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// err is the job's first command error; an absent key is an answer, not an
// error.
func (job *pipelineJob) err() error {
	for _, c := range job.cmds {
		if err := c.cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
	}
	return nil
}

// evalSha queues a script by SHA: the round trip carries the hash, not the
// script, and the script is loaded the first time Redis says it lacks it.
func evalSha(s *redis.Script, keys []string, args ...any) pipelineCmd {
	return pipelineCmd{
		script: s,
		queue: func(ctx context.Context, p redis.Pipeliner) redis.Cmder {
			return s.EvalSha(ctx, p, keys, args...)
		},
	}
}
