package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

const (
	maxNodeRows  = 12
	maxEventRows = 8
	header       = "   TIME  REPLICAS  PENDING  BOUND  NODECLAIMS  MACHINES  NODES READY  $/HOUR"
	clearScreen  = "\033[H\033[2J"
)

// show redraws the table every refresh until ctx ends. On a terminal it
// redraws one screen in place; otherwise (a pipe, a file, a test) it appends
// one row per refresh and each event as it happens.
func (d *demo) show(ctx context.Context, out io.Writer, refresh time.Duration) {
	tty := isTerminal(out)
	if !tty {
		fmt.Fprintln(out, header)
	}
	prev := &snapshot{NodeClaims: map[string]nodeClaim{}, Nodes: map[string]node{}}
	seen := 0
	tick := time.NewTicker(refresh)
	defer tick.Stop()
	for {
		s, err := observe(ctx, d.w, d.p)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			d.events.add("reading the clusters: %v", err)
		} else {
			diff(prev, s, d.events)
			prev = s
			d.latest.Store(s)
		}
		if d.p.exited() {
			d.events.add("the provider exited: see %s", d.rel(d.p.logPath))
		}
		if tty {
			fmt.Fprint(out, clearScreen+d.screen(prev))
		} else {
			fmt.Fprintln(out, d.row(prev))
			var fresh []string
			fresh, seen = d.events.since(seen)
			for _, e := range fresh {
				fmt.Fprintln(out, "        > "+strings.TrimSpace(e))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (d *demo) row(s *snapshot) string {
	cost := "-"
	if c, ok := s.Cost(); ok {
		cost = fmt.Sprintf("%.3f", c)
	}
	return fmt.Sprintf("%7s  %8d  %7d  %5d  %10d  %8d  %11s  %6s",
		time.Since(d.t0).Round(time.Second), s.Replicas, s.PodsPending, s.PodsBound, len(s.NodeClaims), s.Machines,
		fmt.Sprintf("%d/%d", s.ReadyNodes(), len(s.Nodes)), cost)
}

// screen is the whole dashboard for a terminal.
func (d *demo) screen(s *snapshot) string {
	var b strings.Builder
	fmt.Fprintf(&b, "karpenter-clusterapi demo: Karpenter on Cluster API with a simulated AWS, both modes side by side:\n"+
		"MD = MachineDeployment mode (NodePool demo, workload inflate), Machine = Machine mode (NodePool machines, workload inflate-machines, spot first).\n"+
		"Ctrl-C stops it all.\n\n")
	fmt.Fprintf(&b, "%s\n%s\n\n", header, d.row(s))
	fmt.Fprintf(&b, "  %-8s %-30s %-12s %-11s %-10s %5s %7s\n", "MODE", "NODE", "TYPE", "ZONE", "CAPACITY", "PODS", "$/HOUR")
	names := sortedKeys(s.Nodes)
	sort.SliceStable(names, func(i, j int) bool { return s.Nodes[names[i]].Mode < s.Nodes[names[j]].Mode })
	for i, name := range names {
		if i == maxNodeRows {
			fmt.Fprintf(&b, "  ... and %d more\n", len(names)-maxNodeRows)
			break
		}
		n := s.Nodes[name]
		state := ""
		if !n.Ready {
			state = " (not Ready)"
		}
		price := "-"
		if p, ok := s.Price(n.Offering); ok {
			price = fmt.Sprintf("%.3f", p)
		}
		fmt.Fprintf(&b, "  %-8s %-30s %-12s %-11s %-10s %5d %7s%s\n", orNone(n.Mode), name, n.Offering.Type, n.Offering.Zone, n.Offering.CapacityType, n.Pods, price, state)
	}
	if len(names) == 0 {
		fmt.Fprintf(&b, "  (no nodes)\n")
	}
	events, _ := d.events.since(0)
	if len(events) > maxEventRows {
		events = events[len(events)-maxEventRows:]
	}
	fmt.Fprintf(&b, "\nWhat happened (newest last):\n")
	for _, e := range events {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	fmt.Fprintf(&b, "\n%s", d.usage())
	return b.String()
}

// usage says how to look at the clusters beside the demo.
func (d *demo) usage() string {
	return fmt.Sprintf("Beside it:  KUBECONFIG=%s kubectl get clusterapinodeclasses,nodepools,nodeclaims,nodes -o wide\n"+
		"            KUBECONFIG=%s kubectl get machinedeployments,machines,awsmachines\n"+
		"Logs:       %s  %s\n",
		d.rel(d.kubeconfigs.spoke), d.rel(d.kubeconfigs.hub), d.rel(d.p.logPath), d.rel(d.worldLog))
}

// rel shortens a path to one relative to the working directory when it is below it.
func (d *demo) rel(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	if r, err := filepath.Rel(wd, path); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return path
}

func isTerminal(out io.Writer) bool {
	f, ok := out.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
