// Command dashcheck checks lockwarden's Grafana dashboard without Grafana (AGPL, not
// used): the JSON is decoded strictly into the dashboard type of the Apache-2.0
// grafana-foundation-sdk (an unknown field, a wrong type or a missing required field
// fails) and validated by it, and every panel target's PromQL expression is parsed by
// the Prometheus module's own parser.
//
// Usage: dashcheck DASHBOARD.json — prints one line per expression, then a summary;
// exits 1 naming the first problem.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/prometheus/prometheus/promql/parser"
)

// The part of the dashboard the expressions are read from: kept generic so that a
// panel type the SDK decodes into its own struct still has its targets found.
type panels struct {
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// failed reports whether err is a real error: the SDK returns its error list as an
// `error` even when the list is empty (a typed nil), which is no failure.
func failed(err error) bool {
	if errs, ok := err.(cog.BuildErrors); ok {
		return len(errs) > 0
	}
	return err != nil
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "dashcheck: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: dashcheck DASHBOARD.json")
		os.Exit(2)
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail("%v", err)
	}
	// Panels and data queries decode into their plugin's types only once registered.
	plugins.RegisterDefaultPlugins()
	var dash dashboard.Dashboard
	if err := dash.UnmarshalJSONStrict(raw); failed(err) {
		fail("%s does not match the dashboard schema: %v", os.Args[1], err)
	}
	if err := dash.Validate(); failed(err) {
		fail("%s: %v", os.Args[1], err)
	}
	var p panels
	if err := json.Unmarshal(raw, &p); err != nil {
		fail("%v", err)
	}
	// Default options: what a Prometheus server accepts without feature flags.
	promql := parser.NewParser(parser.Options{})
	count := 0
	for _, panel := range p.Panels {
		if len(panel.Targets) == 0 {
			fail("panel %q has no query", panel.Title)
		}
		for _, target := range panel.Targets {
			if target.Expr == "" {
				fail("panel %q, query %s: no expr", panel.Title, target.RefID)
			}
			if _, err := promql.ParseExpr(target.Expr); err != nil {
				fail("panel %q, query %s: %q does not parse: %v", panel.Title, target.RefID, target.Expr, err)
			}
			fmt.Printf("parsed: %s\n", target.Expr)
			count++
		}
	}
	fmt.Printf("ok: %d panels, %d expressions\n", len(p.Panels), count)
}
