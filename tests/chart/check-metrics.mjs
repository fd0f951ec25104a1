#!/usr/bin/env node
// Checks the Grafana dashboards and the alert rules against the metric contract in docs/metrics.md:
//   - each dashboard is JSON with a uid, unique panel ids, and a query on every panel;
//   - every PromQL expression (panel targets, template variables, alert and recording rules) uses only
//     metrics from the contract table, or Prometheus's own per-target series; histogram series
//     (_bucket, _sum, _count) only of histograms; and only template variables the dashboard defines;
//   - every metric of the contract appears on a dashboard, so the contract has no unwatched metric;
//   - every alert's runbook_url names a docs page and one of its headings' anchors (GitHub's slugs).
//
// Usage: node check-metrics.mjs <repo-root>
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { parse as parseYaml } from "yaml";

const root = process.argv[2];
if (!root) {
  console.error("usage: check-metrics.mjs <repo-root>");
  process.exit(2);
}
const problems = [];
const check = (cond, msg) => {
  if (!cond) problems.push(msg);
  return cond;
};

// ---- the contract: rows "| `zps_name` | type | labels | exported by | meaning |"
const contract = new Map();
for (const line of readFileSync(join(root, "docs/metrics.md"), "utf8").split("\n")) {
  const m = /^\|\s*`(zps_[a-z0-9_]+)`\s*\|\s*(counter|gauge|histogram)\s*\|/.exec(line);
  if (m) {
    check(!contract.has(m[1]), `docs/metrics.md lists ${m[1]} twice`);
    contract.set(m[1], m[2]);
  }
}
check(contract.size >= 18, `docs/metrics.md table has ${contract.size} metrics; expected the full contract`);
for (const [name, type] of contract) {
  check(type !== "counter" || name.endsWith("_total"), `contract: counter ${name} does not end in _total`);
  check(type === "counter" || !name.endsWith("_total"), `contract: ${type} ${name} ends in _total`);
}
// Series Prometheus itself attaches to every target.
const BUILTIN = new Set(["up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling", "scrape_series_added"]);
const KEYWORDS = new Set(["by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "inf", "nan", "atan2", "Inf", "NaN"]);

/** Metric names used by a PromQL expression (Grafana variables already replaced). */
function metricNames(expr) {
  let s = expr
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`/g, '""') // string literals
    .replace(/\{[^{}]*\}/g, " ") // label matchers
    .replace(/\[[^\]]*\]/g, " ") // ranges and subqueries
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, " "); // label lists
  const names = [];
  for (const m of s.matchAll(/[A-Za-z_:][A-Za-z0-9_:]*/g)) {
    const after = s.slice(m.index + m[0].length).trimStart();
    if (after.startsWith("(")) continue; // a function or aggregation
    if (KEYWORDS.has(m[0])) continue;
    const before = s.slice(0, m.index);
    if (/[0-9.]$/.test(before)) continue; // the exponent or unit of a number (1e3, 5m)
    names.push(m[0]);
  }
  return names;
}

const used = new Set();
function checkExpr(expr, where) {
  if (!check(typeof expr === "string" && expr.trim(), `${where}: empty query`)) return;
  const names = metricNames(expr);
  check(names.length > 0, `${where}: no metric in '${expr}'`);
  for (const n of names) {
    if (BUILTIN.has(n)) continue;
    const hist = /^(.*)_(bucket|sum|count)$/.exec(n);
    if (contract.has(n)) {
      check(contract.get(n) !== "histogram", `${where}: histogram ${n} has no series of its own; use ${n}_bucket, _sum or _count`);
      used.add(n);
    } else if (hist && contract.get(hist[1]) === "histogram") {
      used.add(hist[1]);
    } else {
      check(false, `${where}: metric '${n}' is not in docs/metrics.md`);
    }
  }
}

// ---- dashboards
const GRAFANA_BUILTINS = ["__rate_interval", "__interval", "__range", "__range_s", "__interval_ms", "__all", "__name"];
const dashDir = join(root, "helm/zps/dashboards");
const dashFiles = readdirSync(dashDir).filter((f) => f.endsWith(".json"));
check(dashFiles.length > 0, "no dashboards in helm/zps/dashboards");
const uids = new Set();
for (const f of dashFiles) {
  let d;
  try {
    d = JSON.parse(readFileSync(join(dashDir, f), "utf8"));
  } catch (e) {
    check(false, `${f}: not JSON: ${e.message}`);
    continue;
  }
  check(typeof d.uid === "string" && d.uid && !uids.has(d.uid), `${f}: missing or duplicate uid`);
  uids.add(d.uid);
  check(typeof d.title === "string" && d.title, `${f}: no title`);
  const vars = new Set((d.templating?.list ?? []).map((v) => v.name));
  const substitute = (expr, where) =>
    expr.replace(/\$\{(\w+)(?::\w+)?\}|\$(\w+)/g, (_, a, b) => {
      const name = a ?? b;
      check(vars.has(name) || GRAFANA_BUILTINS.includes(name), `${where}: uses undefined variable $${name}`);
      return name.startsWith("__") ? "5m" : ".*";
    });
  for (const v of d.templating?.list ?? []) {
    if (v.type !== "query") continue;
    const q = typeof v.query === "string" ? v.query : v.query?.query;
    const where = `${f} variable $${v.name}`;
    const lv = /^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$/.exec((q ?? "").trim());
    if (check(lv, `${where}: expected label_values(<selector>, <label>)`)) checkExpr(substitute(lv[1], where), where);
  }
  const panels = (d.panels ?? []).flatMap((p) => [p, ...(p.panels ?? [])]);
  const ids = new Set();
  for (const p of panels) {
    check(!ids.has(p.id), `${f}: duplicate panel id ${p.id}`);
    ids.add(p.id);
    if (p.type === "row") continue;
    const where = `${f} panel '${p.title}'`;
    check(p.title && p.description, `${where}: needs a title and a description`);
    if (!check(Array.isArray(p.targets) && p.targets.length > 0, `${where}: no queries`)) continue;
    for (const t of p.targets) checkExpr(substitute(t.expr ?? "", where), `${where} ${t.refId}`);
  }
}
const dashboardMetrics = new Set(used);

// ---- alert rules
/** The anchors GitHub gives a Markdown page's headings: lowercased, punctuation dropped, spaces to '-'. */
function anchors(page) {
  const out = new Set();
  let fenced = false;
  for (const line of readFileSync(page, "utf8").split("\n")) {
    if (/^\s*(```|~~~)/.test(line)) fenced = !fenced;
    const h = !fenced && /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!h) continue;
    let slug = h[1].toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, "").replace(/\s/g, "-");
    for (let n = 1, base = slug; out.has(slug); n++) slug = `${base}-${n}`;
    out.add(slug);
  }
  return out;
}
const pageAnchors = new Map();
let runbooks = 0;
const rulesDir = join(root, "helm/zps/rules");
for (const f of readdirSync(rulesDir).filter((x) => x.endsWith(".yaml"))) {
  const doc = parseYaml(readFileSync(join(rulesDir, f), "utf8"));
  for (const g of doc.groups ?? []) {
    for (const r of g.rules ?? []) {
      checkExpr(r.expr, `${f} ${r.alert ?? r.record}`);
      if (!r.alert) continue;
      const url = r.annotations?.runbook_url;
      if (!check(typeof url === "string" && url, `${f} ${r.alert}: no runbook_url`)) continue;
      const m = /^(docs\/[^#]+\.md)#(.+)$/.exec(url);
      if (!check(m, `${f} ${r.alert}: runbook_url '${url}' is not docs/<page>.md#<anchor>`)) continue;
      if (!pageAnchors.has(m[1])) {
        try {
          pageAnchors.set(m[1], anchors(join(root, m[1])));
        } catch (e) {
          pageAnchors.set(m[1], null);
        }
      }
      const have = pageAnchors.get(m[1]);
      if (!check(have, `${f} ${r.alert}: runbook_url names ${m[1]}, which cannot be read`)) continue;
      check(have.has(m[2]), `${f} ${r.alert}: runbook_url anchor #${m[2]} is no heading of ${m[1]}`);
      runbooks++;
    }
  }
}

for (const name of contract.keys()) {
  check(dashboardMetrics.has(name), `${name} is in docs/metrics.md but on no dashboard`);
}

if (problems.length) {
  for (const p of problems) console.error(`FAIL ${p}`);
  process.exit(1);
}
console.log(`ok: ${dashFiles.length} dashboard(s) and the alert rules use only the ${contract.size} contract metrics, and the dashboards cover all of them; ${runbooks} runbook links point to headings`);
