package imexdomain

import (
	"bufio"
	"regexp"
	"strconv"
	"strings"
)

// ctlReport is what nvidia-imex-ctl -N says: the nodes by index, each
// node's row of the connectivity table (its view of every node, by
// index), and whether the domain is UP.
type ctlReport struct {
	nodes map[int]string
	rows  map[int]map[int]string
	up    bool
}

var (
	nodeLine = regexp.MustCompile(`^\s*Node\s*#\s*(\d+)\s*-\s*([0-9A-Fa-f.:]+)\s*-`)
	cellRE   = regexp.MustCompile(`^[A-Z]$`)
)

// parseCtl reads -N's output loosely: only the words and their order
// count, not the spacing (the simulation's docs say its spacing is
// approximate).
func parseCtl(out string) ctlReport {
	r := ctlReport{nodes: map[int]string{}, rows: map[int]map[int]string{}}
	var columns []int
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if m := nodeLine.FindStringSubmatch(line); m != nil {
			i, _ := strconv.Atoi(m[1])
			r.nodes[i] = m[2]
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(strings.Join(strings.Fields(k), " "), "Domain State") {
			r.up = strings.EqualFold(strings.TrimSpace(v), "UP")
			continue
		}
		fields := strings.Fields(line)
		if len(fields) > 1 && strings.Contains(line, "From") && strings.Contains(line, "To") {
			columns = columns[:0]
			for _, f := range fields {
				if i, err := strconv.Atoi(f); err == nil {
					columns = append(columns, i)
				}
			}
			continue
		}
		if columns == nil || len(fields) != len(columns)+1 {
			continue
		}
		from, err := strconv.Atoi(fields[0])
		if err != nil {
			continue
		}
		row := map[int]string{}
		for j, c := range fields[1:] {
			if !cellRE.MatchString(c) {
				row = nil
				break
			}
			row[columns[j]] = c
		}
		if row != nil {
			r.rows[from] = row
		}
	}
	return r
}

// view is node ip's view of the others: each peer's cell in its row, by
// address; nil when the report has no row for it.
func (r ctlReport) view(ip string) map[string]string {
	for i, addr := range r.nodes {
		if addr != ip {
			continue
		}
		row, ok := r.rows[i]
		if !ok {
			return nil
		}
		out := map[string]string{}
		for j, c := range row {
			if peer, ok := r.nodes[j]; ok && peer != ip {
				out[peer] = c
			}
		}
		return out
	}
	return nil
}
