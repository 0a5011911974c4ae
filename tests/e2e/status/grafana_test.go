package status

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// dashboardPath is the Grafana dashboard the repository ships over the
// broker's Prometheus metrics.
const dashboardPath = "contrib/grafana/npurun-dashboard.json"

// TestGrafanaDashboard: every PromQL expression of the shipped Grafana
// dashboard (its panels' targets and its variables' queries) parses, and
// names only metrics a real broker exports, read from its /metrics (a
// lease held, a busy one, utilization sampled, an idle lease reclaimed,
// so that every family has a series), with labels those metrics have;
// the dashboard is one Grafana takes (panels with targets, a Prometheus
// data source variable, no data source uid written in). Altered copies
// show that the check fails where it should.
func TestGrafanaDashboard(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(harness.Root(), dashboardPath))
	if err != nil {
		t.Fatal(err)
	}
	u := newUtilFiles(t)
	u.set(0, "0")
	u.set(1, "80 1024 32768") // and its memory, in MiB
	b := harness.StartBroker(t, harness.FakeConfig(3)+u.conf()+"\n[broker]\nmetrics_listen = \"127.0.0.1:0\"\n"+idleConf)
	busy := harness.Hold(t, b, "busy", "-d", "1")
	defer busy.Release()
	harness.Hold(t, b, "idle", "-d", "0")
	b.WaitLog(0, "is reclaimed ([idle] after = 3s)")
	exp := parseExposition(t, metricsOf(t, b))
	for _, name := range []string{"npurun_devices", "npurun_grant_wait_seconds_bucket", "npurun_lease_idle_seconds", "npurun_idle_reclaimed_total", "npurun_device_utilization_percent", "npurun_device_memory_used_bytes"} {
		if !exp.has(name) {
			t.Fatalf("the broker's metrics lack %s (the test's setup is wrong):\n%s", name, metricsOf(t, b))
		}
	}

	alter := func(old, new string) []byte {
		t.Helper()
		if !strings.Contains(string(text), old) {
			t.Fatalf("the dashboard has no %q to alter", old)
		}
		return []byte(strings.Replace(string(text), old, new, 1))
	}
	tests := []struct {
		name string
		json []byte
		want string // in an error; "": none
	}{
		{"the dashboard", text, ""},
		{"a metric the broker does not export", alter("npurun_waiters{", "npurun_waiting{"), `names metric npurun_waiting, which the broker does not export`},
		{"a histogram's own name", alter("npurun_grant_wait_seconds_bucket{", "npurun_grant_wait_seconds{"), "names metric npurun_grant_wait_seconds,"},
		{"a variable's metric", alter("label_values(npurun_devices,", "label_values(npurun_device,"), "names metric npurun_device,"},
		{"a label the metric lacks", alter("sum by (state) (npurun_devices", "sum by (stat) (npurun_devices"), `label "stat"`},
		{"a matcher's label the metric lacks", alter(`npurun_waiters{instance=~\"$instance\"}`, `npurun_waiters{instance=~\"$instance\",kind=\"x\"}`), `label "kind"`},
		{"a function PromQL lacks", alter("rate(npurun_grants_total", "rat(npurun_grants_total"), `unknown function "rat"`},
		{"unbalanced", alter("sum by (pool) (npurun_waiters", "sum by (pool) ((npurun_waiters"), "unbalanced"},
		{"a hard-coded data source", alter(`"uid": "${datasource}"`, `"uid": "P1809F7CD0C75ACF3"`), `data source uid "P1809F7CD0C75ACF3" is written in`},
		{"no data source variable", alter(`"type": "datasource"`, `"type": "custom"`), "no data source variable"},
		{"a panel without targets", alter(`"targets": [`, `"targetz": [`), "has no targets"},
		{"not JSON", alter("{", "{,"), "not JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			errs := checkDashboard(tc.json, exp)
			if tc.want == "" {
				for _, err := range errs {
					t.Error(err)
				}
				return
			}
			for _, err := range errs {
				if strings.Contains(err.Error(), tc.want) {
					return
				}
			}
			t.Errorf("errors %q, want one with %q", errs, tc.want)
		})
	}
}

// exposition is what a /metrics page exports: each metric name PromQL
// can select (a histogram's _bucket, _sum and _count, not its own name),
// with the label names of its series.
type exposition map[string]map[string]bool

func (e exposition) has(name string) bool { _, ok := e[name]; return ok }

var (
	sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? \S+( \S+)?$`)
	labelPair  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"`)
)

// parseExposition reads a Prometheus text exposition: its # TYPE lines
// (each family, series or not) and its samples.
func parseExposition(t *testing.T, text string) exposition {
	t.Helper()
	e := exposition{}
	add := func(name string) map[string]bool {
		if e[name] == nil {
			e[name] = map[string]bool{}
		}
		return e[name]
	}
	for _, line := range strings.Split(text, "\n") {
		switch f := strings.Fields(line); {
		case len(f) == 0, len(f) >= 2 && f[0] == "#" && f[1] == "HELP":
		case len(f) == 4 && f[0] == "#" && f[1] == "TYPE":
			switch f[3] {
			case "histogram":
				add(f[2] + "_bucket")["le"] = true
				add(f[2] + "_sum")
				add(f[2] + "_count")
			case "summary":
				add(f[2] + "_sum")
				add(f[2] + "_count")
				add(f[2])
			default:
				add(f[2])
			}
		case f[0] == "#":
		default:
			m := sampleLine.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("metrics line %q does not parse", line)
			}
			labels := add(m[1])
			for _, p := range labelPair.FindAllStringSubmatch(m[2], -1) {
				labels[p[1]] = true
			}
		}
	}
	return e
}

// scrapeLabels are the labels Prometheus gives every series it scrapes.
var scrapeLabels = []string{"instance", "job"}

// checkDashboard checks Grafana dashboard text against the metrics exp.
func checkDashboard(text []byte, exp exposition) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	var dash struct {
		Title         string
		UID           string
		SchemaVersion int
		Panels        []map[string]any
		Templating    struct {
			List []map[string]any
		}
	}
	if err := json.Unmarshal(text, &dash); err != nil {
		return []error{fmt.Errorf("the dashboard is not JSON: %w", err)}
	}
	var whole any
	_ = json.Unmarshal(text, &whole)
	if dash.Title == "" || dash.UID == "" || dash.SchemaVersion <= 0 {
		fail("the dashboard has no title, uid or schemaVersion")
	}

	// The data source: a variable of type datasource for Prometheus, and
	// every data source reference names it, never a uid of one Grafana.
	dsVar := ""
	for _, v := range dash.Templating.List {
		if v["type"] == "datasource" && v["query"] == "prometheus" {
			dsVar, _ = v["name"].(string)
		}
	}
	if dsVar == "" {
		fail("the dashboard has no data source variable (templating: type datasource, query prometheus)")
	} else {
		walkDatasources(whole, func(ref any) {
			uid := ref
			if m, ok := ref.(map[string]any); ok {
				uid = m["uid"]
			}
			if s, _ := uid.(string); s != "${"+dsVar+"}" && s != "$"+dsVar {
				fail("data source uid %q is written in: each panel, target and variable must name ${%s}", uid, dsVar)
			}
		})
	}

	var exprs []string
	var walk func(ps []map[string]any)
	walk = func(ps []map[string]any) {
		for _, p := range ps {
			title, _ := p["title"].(string)
			if p["type"] == "row" {
				var sub []map[string]any
				if b, err := json.Marshal(p["panels"]); err == nil {
					_ = json.Unmarshal(b, &sub)
				}
				walk(sub)
				continue
			}
			if _, ok := p["gridPos"].(map[string]any); !ok || p["type"] == nil {
				fail("panel %q has no type or no gridPos", title)
			}
			if p["datasource"] == nil {
				fail("panel %q names no data source", title)
			}
			targets, _ := p["targets"].([]any)
			if len(targets) == 0 {
				fail("panel %q has no targets", title)
			}
			for _, tg := range targets {
				m, _ := tg.(map[string]any)
				expr, _ := m["expr"].(string)
				if ref, _ := m["refId"].(string); expr == "" || ref == "" {
					fail("panel %q: a target without an expr or a refId: %v", title, tg)
					continue
				}
				exprs = append(exprs, expr)
			}
		}
	}
	if len(dash.Panels) == 0 {
		fail("the dashboard has no panels")
	}
	walk(dash.Panels)

	// The variables' queries: label_values(METRIC, LABEL).
	for _, v := range dash.Templating.List {
		if v["type"] != "query" {
			continue
		}
		q, _ := v["definition"].(string)
		m := regexp.MustCompile(`^label_values\(\s*(.+?)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`).FindStringSubmatch(q)
		if m == nil {
			fail("variable %v: query %q is not label_values(METRIC, LABEL)", v["name"], q)
			continue
		}
		exprs = append(exprs, fmt.Sprintf("count by (%s) (%s)", m[2], m[1]))
	}
	for _, expr := range exprs {
		for _, err := range checkPromQL(expr, exp) {
			fail("%q: %v", expr, err)
		}
	}
	return errs
}

// walkDatasources calls f with each "datasource" value in v.
func walkDatasources(v any, f func(any)) {
	switch x := v.(type) {
	case map[string]any:
		for k, sub := range x {
			if k == "datasource" {
				f(sub)
				continue
			}
			walkDatasources(sub, f)
		}
	case []any:
		for _, sub := range x {
			walkDatasources(sub, f)
		}
	}
}

// promFuncs are PromQL's functions and aggregations.
var promFuncs = strings.Fields(`abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time
ceil changes clamp clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year
days_in_month deg delta deriv exp floor histogram_avg histogram_count histogram_fraction histogram_quantile
histogram_stddev histogram_stdvar histogram_sum holt_winters double_exponential_smoothing hour idelta increase
irate label_join label_replace last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month
pi predict_linear present_over_time quantile_over_time rad rate resets round scalar sgn sin sinh sort sort_desc
sort_by_label sort_by_label_desc sqrt stddev_over_time stdvar_over_time sum_over_time tan tanh time timestamp vector year`)

// promAggregations are PromQL's aggregation operators: a function, whose
// by or without may come before its parentheses.
var promAggregations = strings.Fields(`sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio`)

// promKeywords are PromQL's words that are not metrics: binary operators
// and modifiers.
var promKeywords = strings.Fields(`and or unless atan2 bool offset by without on ignoring group_left group_right`)

// grafanaVars are the variables Grafana fills in where PromQL has a
// duration.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "24h")

type promToken struct {
	kind byte // 'i' a name, 's' a string, 'n' a number or duration, 'p' punctuation
	text string
}

// lexPromQL splits a PromQL expression into tokens.
func lexPromQL(expr string) ([]promToken, error) {
	var toks []promToken
	s := grafanaVars.Replace(expr)
	isName := func(c byte, first bool) bool {
		return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || !first && c >= '0' && c <= '9'
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			i++
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(s) && s[j] != c {
				if s[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated string at %d", i)
			}
			toks = append(toks, promToken{'s', s[i+1 : j]})
			i = j + 1
		case c >= '0' && c <= '9' || c == '.' && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9':
			j := i
			for j < len(s) && (isName(s[j], false) || s[j] == '.') && s[j] != ':' {
				j++
			}
			toks = append(toks, promToken{'n', s[i:j]})
			i = j
		case c == ':':
			toks = append(toks, promToken{'p', ":"})
			i++
		case isName(c, true):
			j := i
			for j < len(s) && isName(s[j], false) {
				j++
			}
			toks = append(toks, promToken{'i', s[i:j]})
			i = j
		default:
			op := string(c)
			if i+1 < len(s) && slices.Contains([]string{"==", "!=", "<=", ">=", "=~", "!~"}, s[i:i+2]) {
				op = s[i : i+2]
			} else if !strings.ContainsRune("(){}[],+-*/%^<>=@:", rune(c)) {
				return nil, fmt.Errorf("unexpected %q at %d (a Grafana variable outside a string?)", c, i)
			}
			toks = append(toks, promToken{'p', op})
			i += len(op)
		}
	}
	return toks, nil
}

// checkPromQL parses expr enough to find the metrics it selects, the
// labels it matches or groups by and the functions it calls, and checks
// them against exp.
func checkPromQL(expr string, exp exposition) []error {
	toks, err := lexPromQL(expr)
	if err != nil {
		return []error{err}
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	var metrics []string
	var grouped []string
	depth := map[string]int{}
	pairs := map[string]string{")": "(", "}": "{", "]": "["}
	var stack []string
	next := func(i int) promToken {
		if i+1 < len(toks) {
			return toks[i+1]
		}
		return promToken{}
	}
	for i := 0; i < len(toks); i++ {
		tk := toks[i]
		switch {
		case tk.kind == 'p' && (tk.text == "(" || tk.text == "[" || tk.text == "{"):
			stack = append(stack, tk.text)
			depth[tk.text]++
			switch tk.text {
			case "{":
				// Label matchers of the metric before: NAME OP "value", ...
				var metric string
				if i > 0 && toks[i-1].kind == 'i' && len(metrics) > 0 && metrics[len(metrics)-1] == toks[i-1].text {
					metric = toks[i-1].text
				} else {
					fail("a selector without a metric name")
				}
				for i++; i < len(toks) && toks[i].text != "}"; i++ {
					if toks[i].kind != 'i' || i+2 >= len(toks) || !slices.Contains([]string{"=", "!=", "=~", "!~"}, toks[i+1].text) || toks[i+2].kind != 's' {
						fail("a label matcher does not parse at %q", toks[i].text)
						break
					}
					checkLabel(exp, []string{metric}, toks[i].text, fail)
					i += 2
					if next(i).text == "," {
						i++
					}
				}
				i-- // the } closes below
			case "[":
				// A range or a subquery: DURATION [: [DURATION]].
				for i++; i < len(toks) && toks[i].text != "]"; i++ {
					if toks[i].kind != 'n' && toks[i].text != ":" {
						fail("a range does not parse at %q", toks[i].text)
					}
				}
				i--
			}
		case tk.kind == 'p' && (tk.text == ")" || tk.text == "]" || tk.text == "}"):
			if len(stack) == 0 || stack[len(stack)-1] != pairs[tk.text] {
				return append(errs, fmt.Errorf("unbalanced %q", tk.text))
			}
			stack = stack[:len(stack)-1]
		case tk.kind == 'i' && slices.Contains(promKeywords, tk.text):
			if slices.Contains([]string{"by", "without", "on", "ignoring", "group_left", "group_right"}, tk.text) && next(i).text == "(" {
				for i += 2; i < len(toks) && toks[i].text != ")"; i++ {
					if toks[i].text == "," {
						continue
					}
					if toks[i].kind != 'i' {
						fail("a label list does not parse at %q", toks[i].text)
						break
					}
					grouped = append(grouped, toks[i].text)
				}
				if i >= len(toks) {
					return append(errs, fmt.Errorf("unbalanced ( after %s", tk.text))
				}
			}
		case tk.kind == 'i' && (next(i).text == "(" || slices.Contains(promAggregations, tk.text) && (next(i).text == "by" || next(i).text == "without")):
			if !slices.Contains(promFuncs, tk.text) && !slices.Contains(promAggregations, tk.text) {
				fail("unknown function %q", tk.text)
			}
		case tk.kind == 'i':
			if !exp.has(tk.text) {
				fail("names metric %s, which the broker does not export", tk.text)
			}
			metrics = append(metrics, tk.text)
		}
	}
	if len(stack) > 0 {
		fail("unbalanced %q", stack[len(stack)-1])
	}
	if len(metrics) == 0 {
		fail("selects no metric")
	}
	for _, l := range grouped {
		checkLabel(exp, metrics, l, fail)
	}
	return errs
}

// checkLabel fails where no metric of metrics that has series has label
// (or Prometheus's own labels).
func checkLabel(exp exposition, metrics []string, label string, fail func(string, ...any)) {
	if slices.Contains(scrapeLabels, label) {
		return
	}
	for _, m := range metrics {
		if exp[m][label] {
			return
		}
	}
	fail("label %q is none of %v's", label, metrics)
}
