#!/usr/bin/env node
// Validates the output of `helm template` for one scenario (a file in tests/chart/values/):
//   1. every object against its Kubernetes or Prometheus Operator schema, unknown fields rejected
//      (lib/k8s.mjs);
//   2. the shape the scenario promises (which objects exist, probes, security, volumes, monitoring).
//
// Usage: node validate-manifests.mjs <scenario> <rendered.yaml> <repo-root>
// Exit 0 when everything holds, 1 with one line per problem otherwise.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import { parse as parseYaml } from "yaml";
import { describe, loadYamlDocs, validateObject } from "./lib/k8s.mjs";

const [scenario, renderedFile, repoRoot] = process.argv.slice(2);
if (!scenario || !renderedFile || !repoRoot) {
  console.error("usage: validate-manifests.mjs <scenario> <rendered.yaml> <repo-root>");
  process.exit(2);
}

const problems = [];
const fail = (msg) => problems.push(msg);
const check = (cond, msg) => {
  if (!cond) fail(msg);
  return cond;
};

const objects = loadYamlDocs(renderedFile);
check(objects.length > 0, "helm template rendered no objects");

// ---- 1. schemas
for (const obj of objects) {
  for (const e of validateObject(obj)) fail(`${describe(obj)}: ${e}`);
  check(obj.metadata?.namespace === "training", `${describe(obj)}: metadata.namespace is not the release namespace`);
  check(obj.metadata?.labels?.["app.kubernetes.io/instance"] === "zps", `${describe(obj)}: no app.kubernetes.io/instance label`);
  check((obj.metadata?.name ?? "").length <= 63, `${describe(obj)}: name longer than 63 characters`);
}

// ---- 2. shape
const all = (kind) => objects.filter((o) => o.kind === kind);
const one = (kind, name) => objects.find((o) => o.kind === kind && (!name || o.metadata.name === name));
const subset = (small, big) => Object.entries(small ?? {}).every(([k, v]) => big?.[k] === v);

const sts = one("StatefulSet");
const headless = one("Service", "zps-headless");
const coordinator = one("Service", "zps-coordinator");
const config = one("ConfigMap", "zps");
if (!check(sts && headless && coordinator && config, "missing StatefulSet, zps-headless, zps-coordinator or ConfigMap zps")) {
  finish();
}
const pod = sts.spec.template;
const podSpec = pod.spec;
const c = podSpec.containers.find((x) => x.name === "zps-server");
check(c, "StatefulSet has no zps-server container");

// Services: headless with stable DNS, coordinator selecting ordinal 0, both reaching the pods.
check(sts.spec.serviceName === headless.metadata.name, "StatefulSet.serviceName is not the headless Service");
check(headless.spec.clusterIP === "None", "headless Service has a clusterIP");
check(subset(headless.spec.selector, pod.metadata.labels), "headless Service does not select the shard pods");
const coordSel = { ...coordinator.spec.selector };
check(coordSel["statefulset.kubernetes.io/pod-name"] === `${sts.metadata.name}-0`, "coordinator Service does not select pod <sts>-0");
delete coordSel["statefulset.kubernetes.io/pod-name"];
check(subset(coordSel, pod.metadata.labels), "coordinator Service does not select the shard pods");
for (const svc of [headless, coordinator]) {
  check(svc.spec.publishNotReadyAddresses === true, `${describe(svc)}: must publish not-ready addresses (workers connect before /readyz)`);
  for (const p of svc.spec.ports) {
    check(c.ports.some((cp) => cp.name === p.targetPort || cp.containerPort === p.targetPort), `${describe(svc)}: targetPort ${p.targetPort} is not a container port`);
  }
}
check(coordinator.spec.ports.some((p) => p.port === 7070 && p.targetPort === "control"), "coordinator Service does not expose control port 7070");

// The config file: JSON, option names only, the coordinator endpoint, no ordinal (from the pod name).
let cfg = {};
try {
  cfg = JSON.parse(config.data["config.json"]);
} catch (e) {
  fail(`config.json is not JSON: ${e.message}`);
}
check(cfg.coordinator === "zps-coordinator.training.svc:7070", `config coordinator is ${cfg.coordinator}`);
check(cfg.shards === sts.spec.replicas, "config shards differs from StatefulSet replicas");
check(!("ordinal" in cfg), "config.json must not pin an ordinal: every shard reads it");
for (const k of Object.keys(cfg)) check(/^[a-z][a-z0-9-]*$/.test(k), `config key '${k}' is not an option name`);
check(c.command.join(" ").includes('--ordinal "${POD_NAME##*-}"'), "ordinal not taken from the pod name");
check(c.env.some((e) => e.name === "POD_NAME" && e.valueFrom?.fieldRef?.fieldPath === "metadata.name"), "POD_NAME env missing");

// Probes.
const probePath = (p) => p?.httpGet?.path;
check(probePath(c.startupProbe) === "/healthz", "startupProbe is not /healthz");
check(probePath(c.livenessProbe) === "/healthz", "livenessProbe is not /healthz");
check(probePath(c.readinessProbe) === "/readyz", "readinessProbe is not /readyz");
for (const p of [c.startupProbe, c.livenessProbe, c.readinessProbe]) {
  check(p?.httpGet?.port === "metrics" && c.ports.some((x) => x.name === "metrics"), "a probe does not target the metrics port");
}

// Security.
check(podSpec.securityContext?.runAsNonRoot === true, "pod does not run as non-root");
check(c.securityContext?.readOnlyRootFilesystem === true, "root filesystem is writable");
check(c.securityContext?.allowPrivilegeEscalation === false, "privilege escalation allowed");
check(isDeepStrictEqual(c.securityContext?.capabilities?.drop, ["ALL"]), "capabilities do not drop ALL");
const added = c.securityContext?.capabilities?.add ?? [];
check(podSpec.terminationGracePeriodSeconds >= 60, "terminationGracePeriodSeconds too short for a checkpoint");

// Volumes: config, token, data, tmp.
const mounts = Object.fromEntries(c.volumeMounts.map((m) => [m.name, m.mountPath]));
check(mounts.data === "/var/lib/zps" && cfg["data-dir"] === "/var/lib/zps", "data volume not mounted at the data dir");
check(mounts.tmp === "/tmp", "no writable /tmp");
const tokenVol = podSpec.volumes.find((v) => v.name === "token");
const tokenEnv = c.env.find((e) => e.name === "ZPS_TOKEN_FILE");
check(tokenVol?.secret && tokenEnv?.value?.startsWith(mounts.token + "/"), "token Secret not mounted at ZPS_TOKEN_FILE");
const claim = (sts.spec.volumeClaimTemplates ?? []).find((t) => t.metadata.name === "data");
const dataEmptyDir = podSpec.volumes.find((v) => v.name === "data" && v.emptyDir);

const preStop = c.lifecycle?.preStop?.exec?.command ?? [];
const sm = one("ServiceMonitor");
const pr = one("PrometheusRule");
const dashboards = one("ConfigMap", "zps-dashboards");
const secret = one("Secret");
const tokenKey = tokenEnv?.value?.split("/").pop();

// Changing the shard count (reshard-hooks.yaml): the peers in config.json, and the hook Jobs,
// present only when the count changes.
const jobs = all("Job");
const hookOf = (j) => j.metadata.annotations?.["helm.sh/hook"];
const saveJob = jobs.find((j) => j.metadata.name === "zps-reshard-save");
const donorJobs = jobs.filter((j) => j.metadata.name.startsWith("zps-reshard-donor-"));
function expectPeers(n) {
  const peers = (cfg["reshard-peers"] ?? "").split(",");
  const want = [...Array(n).keys()].map((i) => `zps-${i}.zps-headless.training.svc:7072`);
  check(isDeepStrictEqual(peers, want), `reshard-peers is '${cfg["reshard-peers"]}', expected ordinals 0..${n - 1}`);
  check(cfg["reshard-port"] === 7072 && c.ports.some((p) => p.name === "reshard" && p.containerPort === 7072), "no reshard port 7072 in config and container");
}
function expectNoReshardHooks() {
  check(jobs.length === 0, `hook Jobs rendered although the shard count does not change: ${jobs.map(describe)}`);
}
function expectSaveHook() {
  if (!check(saveJob, "no pre-upgrade checkpoint Job zps-reshard-save")) return;
  check(hookOf(saveJob) === "pre-upgrade", "zps-reshard-save is not a pre-upgrade hook");
  const sc = saveJob.spec.template.spec.containers[0];
  check(sc.command.join(" ") === "/usr/local/bin/zps-ckpt save --endpoint zps-coordinator.training.svc:7070", `zps-reshard-save runs '${sc.command.join(" ")}'`);
  check(sc.env.some((e) => e.name === "ZPS_TOKEN_FILE"), "zps-reshard-save has no ZPS_TOKEN_FILE");
  const labels = saveJob.spec.template.metadata.labels;
  check(!subset(headless.spec.selector, labels), "the headless Service selects the checkpoint Job's pod");
  const np = one("NetworkPolicy");
  check(!np || subset(np.spec.ingress[0].from[1].podSelector.matchLabels, labels), "the NetworkPolicy does not admit the checkpoint Job");
}
function expectDonors(from, to) {
  const want = [...Array(to - from).keys()].map((i) => from + i);
  const got = donorJobs.map((j) => Number(j.metadata.name.split("-").pop())).sort((a, b) => a - b);
  check(isDeepStrictEqual(got, want), `donor Jobs for ordinals ${got}, expected ${want}`);
  for (const j of donorJobs) {
    const k = j.metadata.name.split("-").pop();
    const ps = j.spec.template.spec;
    const dc = ps.containers[0];
    check(hookOf(j) === "post-upgrade", `${describe(j)}: not a post-upgrade hook`);
    const claimName = ps.volumes.find((v) => v.name === "data")?.persistentVolumeClaim?.claimName;
    check(claimName === `data-zps-${k}`, `${describe(j)}: mounts PVC ${claimName}, expected data-zps-${k}`);
    check(dc.volumeMounts.some((m) => m.name === "data" && m.mountPath === "/var/lib/zps"), `${describe(j)}: volume not at the data dir`);
    check(ps.hostname === `zps-${k}` && ps.subdomain === "zps-headless", `${describe(j)}: does not take the DNS name zps-${k}.zps-headless`);
    check(subset(headless.spec.selector, j.spec.template.metadata.labels), `${describe(j)}: the headless Service does not select it`);
    check(dc.command.join(" ") === `/usr/local/bin/zps-server --config /etc/zps/config/config.json --ordinal ${k} --reshard-donor`, `${describe(j)}: runs '${dc.command.join(" ")}'`);
    check(ps.restartPolicy === "Never", `${describe(j)}: restartPolicy is not Never`);
  }
}

// Defaults every scenario but monitoring-off keeps.
function expectDefaultsOn() {
  check(claim, "no volumeClaimTemplate 'data'");
  check(one("PodDisruptionBudget") && subset(one("PodDisruptionBudget").spec.selector.matchLabels, pod.metadata.labels), "no PodDisruptionBudget selecting the shards");
  const np = one("NetworkPolicy");
  check(np && subset(np.spec.podSelector.matchLabels, pod.metadata.labels), "no NetworkPolicy selecting the shards");
  check(preStop.join(" ") === "/usr/local/bin/zps-ckpt save --endpoint zps-coordinator.training.svc:7070", `preStop is '${preStop.join(" ")}'`);
  check(one("ServiceAccount") && podSpec.serviceAccountName === one("ServiceAccount").metadata.name, "ServiceAccount not created or not used");
}
function expectSecretRendered() {
  check(secret && secret.metadata.name === tokenVol?.secret?.secretName, "token Secret not rendered or not the one mounted");
  check(secret && typeof secret.data?.[tokenKey] === "string" && Buffer.from(secret.data[tokenKey], "base64").length >= 32, "token Secret has no 32+ byte token");
}
function expectDashboards() {
  if (!check(dashboards, "no dashboards ConfigMap")) return;
  check(dashboards.metadata.labels?.grafana_dashboard === "1", "dashboards ConfigMap lacks grafana_dashboard: \"1\"");
  const keys = Object.keys(dashboards.data ?? {});
  check(keys.length > 0 && keys.every((k) => k.endsWith(".json")), "dashboards ConfigMap holds no .json dashboards");
  for (const k of keys) {
    try {
      const d = JSON.parse(dashboards.data[k]);
      check(Array.isArray(d.panels) && d.panels.length > 0 && d.uid, `${k}: no panels or uid`);
    } catch (e) {
      fail(`${k}: not JSON: ${e.message}`);
    }
  }
}
function expectNoRdma() {
  check(!added.includes("IPC_LOCK"), "IPC_LOCK added without RDMA");
  check(!podSpec.hostNetwork, "hostNetwork without RDMA");
}
function expectNoOperatorObjects() {
  check(!sm && !pr, "ServiceMonitor/PrometheusRule rendered without the monitoring.coreos.com/v1 API");
}

const scenarios = {
  default() {
    expectDefaultsOn();
    expectSecretRendered();
    expectDashboards();
    expectNoRdma();
    expectNoOperatorObjects();
    check(sts.spec.replicas === 2, "default shards is not 2");
    expectPeers(2);
    expectNoReshardHooks();
    check(c.startupProbe.failureThreshold === 60, "default: startupProbe failureThreshold is not 60");
    check(claim && !claim.spec.storageClassName, "default PVC should use the cluster's default StorageClass");
  },
  nvme() {
    expectDefaultsOn();
    expectSecretRendered();
    expectNoRdma();
    check(sts.spec.replicas === 4, "nvme: replicas is not 4");
    check(claim?.spec.storageClassName === "local-nvme", "nvme: PVC storageClassName is not local-nvme");
    check(claim?.spec.resources?.requests?.storage === "3500Gi", "nvme: PVC size is not 3500Gi");
    check(sts.spec.persistentVolumeClaimRetentionPolicy?.whenDeleted === "Delete", "nvme: retention policy not applied");
    check(cfg["memory-budget"] === "96GiB" && cfg["serving-budget"] === "8GiB", "nvme: config options not applied");
    check(podSpec.tolerations?.length === 1 && podSpec.nodeSelector, "nvme: scheduling values not applied");
  },
  rdma() {
    expectDefaultsOn();
    check(!secret, "rdma: a Secret was rendered although auth.existingSecret is set");
    check(tokenVol?.secret?.secretName === "zps-shared-token", "rdma: existing Secret not mounted");
    check(added.includes("IPC_LOCK"), "rdma: IPC_LOCK not added");
    check(isDeepStrictEqual(c.securityContext.capabilities.drop, ["ALL"]), "rdma: drop ALL lost");
    check(c.resources?.limits?.["rdma/hca_shared_devices_a"] === "1" && c.resources?.requests?.["rdma/hca_shared_devices_a"] === "1", "rdma: device resources not requested");
    check(c.resources?.limits?.memory === "32Gi", "rdma: default memory limit lost when adding RDMA resources");
    check(podSpec.hostNetwork === true && podSpec.dnsPolicy === "ClusterFirstWithHostNet", "rdma: hostNetwork / dnsPolicy not set");
    check(podSpec.affinity?.podAntiAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.length === 1, "rdma: no one-shard-per-node anti-affinity under hostNetwork");
    check(c.env.some((e) => e.name === "UCX_TLS" && e.value === "rc,ud,sm,self"), "rdma: UCX_TLS not set");
    check(c.env.some((e) => e.name === "UCX_NET_DEVICES"), "rdma: extraEnv not applied");
    check(podSpec.priorityClassName === "training-critical", "rdma: priorityClassName not applied");
  },
  "monitoring-on"() {
    expectDefaultsOn();
    expectSecretRendered();
    expectDashboards();
    check(dashboards?.metadata.annotations?.grafana_folder === "Training", "monitoring-on: dashboard annotations not applied");
    if (check(sm, "monitoring-on: no ServiceMonitor")) {
      check(sm.metadata.labels?.release === "prom", "monitoring-on: ServiceMonitor labels not applied");
      const selected = all("Service").filter((s) => subset(sm.spec.selector.matchLabels, s.metadata.labels));
      check(selected.length === 1 && selected[0] === headless, `ServiceMonitor must select exactly the headless Service (selects ${selected.map(describe)})`);
      check(headless.metadata.labels?.[sm.spec.jobLabel] === "zps-server", "ServiceMonitor jobLabel does not yield job=zps-server");
      for (const ep of sm.spec.endpoints) {
        check(headless.spec.ports.some((p) => p.name === ep.port), `ServiceMonitor endpoint port '${ep.port}' not on the Service`);
        check(ep.path === "/metrics", "ServiceMonitor path is not /metrics");
      }
      check(isDeepStrictEqual(sm.spec.namespaceSelector?.matchNames, ["training"]), "ServiceMonitor namespaceSelector is not the release namespace");
    }
    if (check(pr, "monitoring-on: no PrometheusRule")) {
      const rules = parseYaml(readFileSync(join(repoRoot, "helm/zps/rules/zps-alerts.yaml"), "utf8"));
      check(isDeepStrictEqual(pr.spec, rules), "PrometheusRule spec differs from helm/zps/rules/zps-alerts.yaml");
      const alerts = pr.spec.groups.flatMap((g) => g.rules.map((r) => r.alert));
      for (const a of ["ZpsShardDown", "ZpsStepStalled", "ZpsCheckpointStale", "ZpsNvmeIoErrors", "ZpsFetchLatencyHigh"]) {
        check(alerts.includes(a), `PrometheusRule lacks alert ${a}`);
      }
    }
  },
  "reshard-up"() {
    expectDefaultsOn();
    check(sts.spec.replicas === 8 && cfg.shards === 8, "reshard-up: shards not 8");
    expectPeers(8);
    expectSaveHook();
    expectDonors(8, 8);
  },
  "reshard-down"() {
    expectDefaultsOn();
    check(sts.spec.replicas === 2 && cfg.shards === 2, "reshard-down: shards not 2");
    check(cfg["reshard-timeout"] === 1200, "reshard-down: reshard.timeoutSeconds not applied");
    // /healthz comes up after the move: the startup probe waits twice the reshard timeout more.
    check(c.startupProbe.failureThreshold === 60 + (2 * 1200) / 5, `reshard-down: startupProbe failureThreshold is ${c.startupProbe.failureThreshold}`);
    expectPeers(8);
    expectSaveHook();
    expectDonors(2, 8);
  },
  "monitoring-off"() {
    expectNoOperatorObjects();
    expectNoRdma();
    check(!dashboards, "monitoring-off: dashboards ConfigMap rendered although disabled");
    check(!one("NetworkPolicy"), "monitoring-off: NetworkPolicy rendered although disabled");
    check(!one("PodDisruptionBudget"), "monitoring-off: PodDisruptionBudget rendered although disabled");
    check(!claim && dataEmptyDir, "monitoring-off: persistence off must give an emptyDir data volume and no PVCs");
    check(!sts.spec.persistentVolumeClaimRetentionPolicy, "monitoring-off: PVC retention policy without PVCs");
    check(!c.lifecycle, "monitoring-off: preStop rendered although checkpointOnStop is false");
    check(sts.spec.replicas === 1 && cfg.shards === 1, "monitoring-off: shards not 1");
  },
};

if (!check(scenarios[scenario], `unknown scenario '${scenario}'`)) finish();
scenarios[scenario]();
finish();

function finish() {
  if (problems.length) {
    for (const p of problems) console.error(`FAIL [${scenario}] ${p}`);
    console.error(`${problems.length} problem(s) in ${renderedFile}`);
    process.exit(1);
  }
  console.log(`ok [${scenario}] ${objects.length} objects valid: ${objects.map(describe).join(", ")}`);
  process.exit(0);
}
