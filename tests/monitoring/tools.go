//go:build tools

// promtool is built from this module too, so that one go.mod/go.sum pins both tools.
package main

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
