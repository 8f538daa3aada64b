package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// prometheus is a real Prometheus server (Debian's prometheus package) run
// as a host process for one test.
type prometheus struct {
	url string
}

// promSeries is one series of an instant query's result.
type promSeries struct {
	Metric map[string]string
	Value  float64
}

// startPrometheus starts the prometheus binary scraping the plugin's
// metrics port at target (host:port) over HTTPS with the bearer token, as
// docs/telemetry.md's scrape configuration does (insecure_skip_verify: the
// plugin's certificate is self-signed; honor_labels keeps its node label).
// Without the binary the test is skipped, except under CI=true, where it
// fails (.ci/run installs it).
func startPrometheus(t *testing.T, target, token string) *prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("prometheus is not installed (.ci/run installs Debian's prometheus package): %v", err)
		}
		t.Skipf("prometheus is not installed (apt-get install --no-install-recommends prometheus): %v", err)
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`global: {scrape_interval: 2s, evaluation_interval: 2s}
scrape_configs:
- job_name: gpu-dra-kubelet-plugin
  scheme: https
  honor_labels: true
  authorization: {credentials_file: %q}
  tls_config: {insecure_skip_verify: true}
  static_configs: [{targets: [%q]}]
`, tokenFile, target)
	configFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configFile, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	cmd := exec.Command(bin, "--config.file="+configFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logFile.Name()); err == nil {
				t.Logf("prometheus log:\n%s", b)
			}
		}
	})
	p := &prometheus{url: "http://" + addr}
	ctx := testContext(t)
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		up, err := p.query(ctx, `up{job="gpu-dra-kubelet-plugin"} == 1`)
		return err == nil && len(up) == 1, nil
	})
	if err != nil {
		targets, _ := p.get(ctx, "/api/v1/targets", nil)
		t.Fatalf("prometheus never scraped the plugin at %s: %v\ntargets: %s", target, err, targets)
	}
	return p
}

func (p *prometheus) get(ctx context.Context, path string, q url.Values) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+path+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %d: %s", path, resp.StatusCode, body)
	}
	return body, nil
}

// query evaluates expr now through the HTTP API; an instant vector or
// scalar result is returned as series.
func (p *prometheus) query(ctx context.Context, expr string) ([]promSeries, error) {
	body, err := p.get(ctx, "/api/v1/query", url.Values{"query": {expr}})
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", expr, err)
	}
	var resp struct {
		Status string
		Data   struct {
			ResultType string
			Result     json.RawMessage
		}
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("query %s: %w", expr, err)
	}
	if resp.Data.ResultType != "vector" {
		return nil, fmt.Errorf("query %s: result type %q, want a vector", expr, resp.Data.ResultType)
	}
	var result []struct {
		Metric map[string]string
		Value  [2]any
	}
	if err := json.Unmarshal(resp.Data.Result, &result); err != nil {
		return nil, fmt.Errorf("query %s: %w", expr, err)
	}
	out := make([]promSeries, 0, len(result))
	for _, r := range result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("query %s: value %v: %w", expr, r.Value[1], err)
		}
		out = append(out, promSeries{Metric: r.Metric, Value: v})
	}
	return out, nil
}

// dashboardExpressions returns the PromQL of every target of the Grafana
// dashboard's panels and variables.
func dashboardExpressions(t *testing.T, file string) []string {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string
		Targets []struct{ Expr string }
		Panels  []json.RawMessage
	}
	var d struct {
		Panels     []json.RawMessage
		Templating struct {
			List []struct {
				Type  string
				Query json.RawMessage
			}
		}
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var out []string
	var walk func([]json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, r := range ps {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatalf("%s: panel: %v", file, err)
			}
			for _, tg := range p.Targets {
				if tg.Expr != "" {
					out = append(out, tg.Expr)
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	// Variables: label_values(<selector>, label) is Grafana's; Prometheus
	// evaluates the selector.
	labelValues := regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`)
	for _, v := range d.Templating.List {
		var q struct{ Query string }
		if v.Type != "query" || json.Unmarshal(v.Query, &q) != nil {
			continue
		}
		if m := labelValues.FindStringSubmatch(q.Query); m != nil {
			out = append(out, m[1])
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no PromQL targets", file)
	}
	return out
}

// docExpressions returns the lines of the ```promql blocks of a doc, without
// comments.
func docExpressions(t *testing.T, file string) []string {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in := false
	for _, line := range strings.Split(string(raw), "\n") {
		switch trimmed := strings.TrimSpace(line); {
		case trimmed == "```promql":
			in = true
		case in && trimmed == "```":
			in = false
		case in && trimmed != "" && !strings.HasPrefix(trimmed, "#"):
			out = append(out, trimmed)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no ```promql examples", file)
	}
	return out
}
