package imexd

import (
	"fmt"
	"strings"
)

// legend is the connectivity table's legend as nvidia-imex-ctl -N prints it,
// limited to the states the simulation reports.
const legend = `Connectivity Table Legend:
I - Invalid - Node wasn't reachable, no connection status available
N - Never Connected
D - Disconnected - Connection was lost
C - Connected - Ready for operation
`

// domainStatus is the -N report: the legend, the nodes with their state,
// the connectivity table (row: from, column: to) and the domain state, UP
// when every node is connected to every other.
func (d *Daemon) domainStatus() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var b strings.Builder
	b.WriteString(legend)
	b.WriteString("\nNodes:\n")
	for i, n := range d.nodes {
		state := "UNAVAILABLE"
		if d.state[n] == StateConnected {
			state = "READY"
		}
		fmt.Fprintf(&b, "Node #%-3d - %-15s - %-12s - Version: simulated\n", i, n, state)
	}
	b.WriteString("\n Nodes From\\To")
	for i := range d.nodes {
		fmt.Fprintf(&b, " %3d", i)
	}
	b.WriteString("\n")
	up := true
	for i, from := range d.nodes {
		fmt.Fprintf(&b, " %13d ", i)
		for _, to := range d.nodes {
			s := d.cell(from, to)
			up = up && s == StateConnected
			fmt.Fprintf(&b, " %3s", s)
		}
		b.WriteString("\n")
	}
	state := "UP"
	if !up {
		state = "DOWN"
	}
	fmt.Fprintf(&b, "Domain State: %s\n", state)
	return b.String()
}

// cell is node from's connection to node to: this daemon's own, or the
// peer's as it reported it; I when from's view is not available. d.mu held.
func (d *Daemon) cell(from, to string) string {
	if from == d.cfg.BindIP {
		return d.state[to]
	}
	if from == to && d.state[from] == StateConnected {
		return StateConnected
	}
	view, ok := d.views[from]
	if !ok {
		return StateInvalid
	}
	if s, ok := view[to]; ok {
		return s
	}
	return StateNeverConnected // the peer does not list to (yet)
}
