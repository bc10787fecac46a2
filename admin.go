package telemetrydedup

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func init() {
	caddy.RegisterModule(Admin{})
}

// Admin serves GET /telemetry_dedup/stuck on Caddy's admin listener: the
// assets that look stuck (nearly all recent pings suppressed, none accepted
// for stuck_after), with the decision totals beside them.
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.telemetry_dedup",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/telemetry_dedup/stuck", Handler: caddy.AdminHandlerFunc(serveStuck)}}
}

// stuckReport is the endpoint's answer.
type stuckReport struct {
	// Stuck lists the assets that look stuck, by key_prefix.
	Stuck []stuckAsset `json:"stuck"`
	// Decisions are the decision totals since Caddy started.
	Decisions []decisionCount `json:"decisions"`
}

// decisionCount is one row of caddy_telemetry_dedup_decisions_total.
type decisionCount struct {
	// Decision is the decision label: accepted, suppressed, rejected, ...
	Decision string `json:"decision"`
	// Reason is the reason label, if the decision has one.
	Reason string `json:"reason,omitempty"`
	// Mode is the mode label: enforce, or shadow for a trial's.
	Mode string `json:"mode"`
	// Count is how many pings were so decided.
	Count uint64 `json:"count"`
}

func serveStuck(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed; use GET", r.Method)}
	}
	report := stuckReport{Stuck: allStuckAssets(time.Now()), Decisions: decisionTotals()}
	if report.Stuck == nil {
		report.Stuck = []stuckAsset{}
	}
	if report.Decisions == nil { // nothing decided yet: an empty list, as the README shows it
		report.Decisions = []decisionCount{}
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(report)
}

// decisionTotals reads the decision counter, the same numbers /metrics shows.
func decisionTotals() []decisionCount {
	metricsOnce.Do(initMetrics)
	ch := make(chan prometheus.Metric)
	go func() {
		metrics.decisions.Collect(ch)
		close(ch)
	}()
	var out []decisionCount
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) != nil {
			continue
		}
		c := decisionCount{Count: uint64(d.GetCounter().GetValue())}
		for _, l := range d.GetLabel() {
			switch l.GetName() {
			case "decision":
				c.Decision = l.GetValue()
			case "reason":
				c.Reason = l.GetValue()
			case "mode":
				c.Mode = l.GetValue()
			}
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b decisionCount) int {
		return cmp.Or(strings.Compare(a.Mode, b.Mode), strings.Compare(a.Decision, b.Decision), strings.Compare(a.Reason, b.Reason))
	})
	return out
}

// Interface guards
var _ caddy.AdminRouter = Admin{}
