package fleetsim

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"text/tabwriter"
	"time"
)

// Score is how a decider did against the ground truth. Counts are of pings
// unless they say otherwise. A moving ping is one sent live or in a batch
// while driving; a parked ping likewise while parked; redeliveries are
// neither.
type Score struct {
	// Pings is the number of pings sent, redeliveries included.
	Pings int `json:"pings"`
	// Deliveries is the number of requests.
	Deliveries int `json:"deliveries"`
	// Batches is how many of the deliveries were JSON arrays.
	Batches int `json:"batches"`
	// Accepted is the number of pings that reached the backend.
	Accepted int `json:"accepted"`

	// RedeliveriesSent is the number of pings sent again.
	RedeliveriesSent int `json:"redeliveries_sent"`
	// RedeliveriesAdmitted is how many of them were accepted, each an error:
	// the backend got the same observation twice.
	RedeliveriesAdmitted int `json:"redeliveries_admitted"`

	// MovingPings is the number of moving pings.
	MovingPings int `json:"moving_pings"`
	// MovingAccepted is how many of them were accepted.
	MovingAccepted int `json:"moving_accepted"`
	// LostMoves counts the moving pings that were not accepted although
	// their position is more than LostMoveM from that of the backend's
	// latest ping of the asset at or before their device time. Moving pings
	// before the asset's first accepted ping are not judged.
	LostMoves int `json:"lost_moves"`
	// MaxLostMoveM is the largest such distance of a lost move, in metres;
	// 0 without lost moves.
	MaxLostMoveM float64 `json:"max_lost_move_m"`
	// MaxSuppressedMoveM is the largest such distance of any moving ping
	// that was not accepted, lost move or not: how close the run came to
	// LostMoveM.
	MaxSuppressedMoveM float64 `json:"max_suppressed_move_m"`

	// ParkedPings is the number of parked pings.
	ParkedPings int `json:"parked_pings"`
	// ParkedAdmissions is how many of them were accepted.
	ParkedAdmissions int `json:"parked_admissions"`
	// ParkedWindows is the parked time of all assets together, in Windows.
	ParkedWindows float64 `json:"parked_windows"`
	// ParkedAdmissionsPerWindow is ParkedAdmissions / ParkedWindows: 1 for a
	// decider that lets a parked asset through once per window.
	ParkedAdmissionsPerWindow float64 `json:"parked_admissions_per_window"`

	// Departures counts the transitions from parked to driving whose moving
	// pings went farther than LostMoveM: a run that ends a few metres into a
	// drive has nothing the backend must hear of yet.
	Departures int `json:"departures"`
	// DeparturesNeverAdmitted is how many of them had no moving ping of
	// their driving phase accepted.
	DeparturesNeverAdmitted int `json:"departures_never_admitted"`
	// DepartureDelayMaxM is, over the other departures, the largest true
	// distance the asset travelled between the transition and its first
	// accepted ping of the phase, in metres. Even a decider that accepts
	// everything scores up to one Cadence of driving here.
	DepartureDelayMaxM float64 `json:"departure_delay_max_m"`

	// LostMoveM is the Config's LostMoveM the score was computed with.
	LostMoveM float64 `json:"lost_move_m"`
	// WindowSeconds is the Config's Window, in seconds.
	WindowSeconds float64 `json:"window_seconds"`
}

// outcome is what happened to one asset's pings, gathered for the scores
// that compare pings with each other.
type outcome struct {
	// accepted is every accepted ping, redeliveries included: what the
	// backend holds.
	accepted []Ping
	// missed is every moving ping that was not accepted.
	missed []Ping
	// departures maps each departure phase to the odometer at its start
	// and at its farthest moving ping.
	departures map[int]odometers
}

// score judges the decisions, accepted[i][j] for ping j of delivery i,
// against the ground truth of f.
func score(cfg Config, f fleet, accepted [][]bool) Score {
	s := Score{
		Deliveries:    len(f.deliveries),
		ParkedWindows: f.parked.Seconds() / cfg.Window.Seconds(),
		LostMoveM:     cfg.LostMoveM,
		WindowSeconds: cfg.Window.Seconds(),
	}
	assets := map[string]*outcome{}
	for i, d := range f.deliveries {
		if d.Batch {
			s.Batches++
		}
		for j, p := range d.Pings {
			o := assets[p.Asset]
			if o == nil {
				o = &outcome{departures: map[int]odometers{}}
				assets[p.Asset] = o
			}
			s.count(p, accepted[i][j])
			o.record(p, accepted[i][j])
		}
	}
	for _, o := range assets {
		s.judgeMoves(o)
		s.judgeDepartures(o)
	}
	if s.ParkedWindows > 0 {
		s.ParkedAdmissionsPerWindow = float64(s.ParkedAdmissions) / s.ParkedWindows
	}
	return s
}

// count adds one ping to the counters.
func (s *Score) count(p Ping, accepted bool) {
	s.Pings++
	if accepted {
		s.Accepted++
	}
	switch {
	case p.Redelivery:
		s.RedeliveriesSent++
		if accepted {
			s.RedeliveriesAdmitted++
		}
	case p.Parked:
		s.ParkedPings++
		if accepted {
			s.ParkedAdmissions++
		}
	default:
		s.MovingPings++
		if accepted {
			s.MovingAccepted++
		}
	}
}

// record files one ping of the asset.
func (o *outcome) record(p Ping, accepted bool) {
	if accepted {
		o.accepted = append(o.accepted, p)
	}
	if p.Parked || p.Redelivery {
		return
	}
	if !accepted {
		o.missed = append(o.missed, p)
	}
	if p.truth.departure {
		d := o.departures[p.truth.phase]
		d.start, d.farthest = p.truth.phaseStartOdo, max(d.farthest, p.truth.odometer)
		o.departures[p.truth.phase] = d
	}
}

// odometers are the true distances driven at a departure and at its
// farthest moving ping.
type odometers struct{ start, farthest float64 }

// judgeMoves measures each missed moving ping against the backend's latest
// ping of the asset before it. That is judged after the run, over
// everything accepted, so a ping admitted later from an offline batch counts
// as the asset's record, as it will in the backend.
func (s *Score) judgeMoves(o *outcome) {
	slices.SortStableFunc(o.accepted, func(a, b Ping) int { return a.Time.Compare(b.Time) })
	for _, p := range o.missed {
		prev, ok := latestAtOrBefore(o.accepted, p.Time)
		if !ok {
			continue
		}
		d := distanceM(prev, p)
		s.MaxSuppressedMoveM = max(s.MaxSuppressedMoveM, d)
		if d > s.LostMoveM {
			s.LostMoves++
			s.MaxLostMoveM = max(s.MaxLostMoveM, d)
		}
	}
}

// latestAtOrBefore returns the latest of the pings, sorted by device time,
// at or before t; of several at the same time, the last.
func latestAtOrBefore(sorted []Ping, t time.Time) (Ping, bool) {
	i := sort.Search(len(sorted), func(i int) bool { return sorted[i].Time.After(t) })
	if i == 0 {
		return Ping{}, false
	}
	return sorted[i-1], true
}

// judgeDepartures measures how far the asset had driven when the backend
// first heard of each departure, counting any accepted ping of the phase, a
// redelivery too: the backend got the position either way.
func (s *Score) judgeDepartures(o *outcome) {
	firstOdo := map[int]float64{}
	for _, p := range o.accepted {
		if !p.truth.departure {
			continue
		}
		if odo, ok := firstOdo[p.truth.phase]; !ok || p.truth.odometer < odo {
			firstOdo[p.truth.phase] = p.truth.odometer
		}
	}
	for phase, d := range o.departures {
		if d.farthest-d.start <= s.LostMoveM {
			continue
		}
		s.Departures++
		odo, ok := firstOdo[phase]
		if !ok {
			s.DeparturesNeverAdmitted++
			continue
		}
		s.DepartureDelayMaxM = max(s.DepartureDelayMaxM, odo-d.start)
	}
}

// WriteTable writes the score for people, one line per measure.
func (s Score) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	rows := [][2]string{
		{"pings sent", fmt.Sprintf("%d in %d deliveries (%d batches)", s.Pings, s.Deliveries, s.Batches)},
		{"accepted", fmt.Sprintf("%d (%s of pings)", s.Accepted, percent(s.Accepted, s.Pings))},
		{"redeliveries admitted", fmt.Sprintf("%d of %d (each is a duplicate in the backend)", s.RedeliveriesAdmitted, s.RedeliveriesSent)},
		{"moving pings accepted", fmt.Sprintf("%d of %d (%s)", s.MovingAccepted, s.MovingPings, percent(s.MovingAccepted, s.MovingPings))},
		{fmt.Sprintf("lost moves (> %g m)", s.LostMoveM), fmt.Sprintf("%d, farthest %.1f m", s.LostMoves, s.MaxLostMoveM)},
		{"farthest suppressed move", fmt.Sprintf("%.1f m", s.MaxSuppressedMoveM)},
		{"parked pings accepted", fmt.Sprintf("%d of %d (%s)", s.ParkedAdmissions, s.ParkedPings, percent(s.ParkedAdmissions, s.ParkedPings))},
		{"parked admissions per window", fmt.Sprintf("%.2f over %.1f windows of %s", s.ParkedAdmissionsPerWindow, s.ParkedWindows, time.Duration(s.WindowSeconds*float64(time.Second)))},
		{"departures never admitted", fmt.Sprintf("%d of %d", s.DeparturesNeverAdmitted, s.Departures)},
		{"departure delay, max", fmt.Sprintf("%.1f m driven before the backend heard", s.DepartureDelayMaxM)},
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

// percent formats n/of as a percentage, or "-" when of is 0.
func percent(n, of int) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}
