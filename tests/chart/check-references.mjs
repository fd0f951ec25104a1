#!/usr/bin/env node
// Checks that what an operator is told to point workers at exists in the rendered chart:
//   - every <service>.<namespace>.svc:<port> endpoint and every Secret named in NOTES.txt;
//   - in each worker example in deploy/: ZPS_ENDPOINT names a rendered Service in the rendered
//     namespace whose port leads to the shards' control port; the token comes from the rendered
//     Secret and key; the pods carry the labels the NetworkPolicy admits; and the example itself is
//     valid (Job: Kubernetes schema; JobSet, PyTorchJob: strict JSON schemas in schemas/, with their
//     Job and pod templates checked against the Kubernetes schema).
//
// The chart is rendered as release "zps" in namespace "training", which is what deploy/ assumes.
// Usage: node check-references.mjs <rendered.yaml> <notes.txt> <deploy-file>...
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import Ajv from "ajv";
import { describe, loadYamlDocs, validateJobTemplateSpec, validateObject, validatePodTemplateSpec } from "./lib/k8s.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const [renderedFile, notesFile, ...deployFiles] = process.argv.slice(2);
if (!renderedFile || !notesFile || deployFiles.length === 0) {
  console.error("usage: check-references.mjs <rendered.yaml> <notes.txt> <deploy-file>...");
  process.exit(2);
}

const problems = [];
const check = (cond, msg) => {
  if (!cond) problems.push(msg);
  return cond;
};
const subset = (small, big) => Object.entries(small ?? {}).every(([k, v]) => big?.[k] === v);

const rendered = loadYamlDocs(renderedFile);
const sts = rendered.find((o) => o.kind === "StatefulSet");
const shardPod = sts.spec.template;
const controlPort = shardPod.spec.containers[0].ports.find((p) => p.name === "control");

/** Checks that host:port names a rendered Service that reaches the shards' control port. */
function checkEndpoint(endpoint, where) {
  const m = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(\.[a-z0-9.-]+)?:([0-9]+)$/.exec(endpoint ?? "");
  if (!check(m, `${where}: endpoint '${endpoint}' is not <service>.<namespace>.svc:<port>`)) return null;
  const [name, ns, port] = [m[1], m[3], Number(m[6])];
  const svc = rendered.find((o) => o.kind === "Service" && o.metadata.name === name && o.metadata.namespace === ns);
  if (!check(svc, `${where}: endpoint names Service ${ns}/${name}, which the chart does not render`)) return null;
  const sp = svc.spec.ports.find((p) => p.port === port);
  if (!check(sp, `${where}: Service ${name} has no port ${port}`)) return null;
  check(sp.targetPort === controlPort.name || sp.targetPort === controlPort.containerPort, `${where}: Service ${name} port ${port} does not lead to the control port`);
  const sel = { ...svc.spec.selector };
  delete sel["statefulset.kubernetes.io/pod-name"];
  check(subset(sel, shardPod.metadata.labels), `${where}: Service ${name} does not select the shards`);
  return { name, ns, port, svc };
}

function checkSecret(name, key, where) {
  const s = rendered.find((o) => o.kind === "Secret" && o.metadata.name === name);
  if (!check(s, `${where}: Secret '${name}' is not rendered by the chart`)) return;
  check(key === undefined || (s.data && key in s.data), `${where}: Secret '${name}' has no key '${key}'`);
}

// ---- NOTES.txt
const notes = readFileSync(notesFile, "utf8");
const endpoints = [...notes.matchAll(/[a-z0-9-]+\.[a-z0-9-]+\.svc(?:\.[a-z0-9.-]+)?:[0-9]+/g)].map((m) => m[0]);
check(endpoints.length > 0, "NOTES.txt names no <service>.<namespace>.svc:<port> endpoint");
check(/ZPS_ENDPOINT=\S+/.test(notes), "NOTES.txt does not show ZPS_ENDPOINT=");
for (const ep of new Set(endpoints)) checkEndpoint(ep, "NOTES.txt");
for (const m of notes.matchAll(/Secret (\S+) \(key (\S+?)\)/g)) checkSecret(m[1], m[2], "NOTES.txt");
check(/Secret \S+ \(key /.test(notes), "NOTES.txt does not name the token Secret");
for (const m of notes.matchAll(/svc\/([a-z0-9-]+)/g)) {
  check(rendered.some((o) => o.kind === "Service" && o.metadata.name === m[1]), `NOTES.txt: svc/${m[1]} is not rendered`);
}

// ---- deploy/ worker examples
const ajv = new Ajv({ strict: true, allErrors: true });
const crdSchemas = {
  "jobset.x-k8s.io/v1alpha2/JobSet": ajv.compile(JSON.parse(readFileSync(join(here, "schemas/jobset-v1alpha2.json"), "utf8"))),
  "kubeflow.org/v1/PyTorchJob": ajv.compile(JSON.parse(readFileSync(join(here, "schemas/pytorchjob-v1.json"), "utf8"))),
};
const np = rendered.find((o) => o.kind === "NetworkPolicy");
const clientSelectors = (np?.spec.ingress ?? []).flatMap((r) => (r.from ?? []).filter((f) => f.podSelector && !f.namespaceSelector).map((f) => f.podSelector.matchLabels));

/** Pod templates of a workload: [path, PodTemplateSpec]. Validates the object on the way. */
function podTemplates(obj, where) {
  const crd = crdSchemas[`${obj.apiVersion}/${obj.kind}`];
  if (obj.kind === "Job" && obj.apiVersion === "batch/v1") {
    for (const e of validateObject(obj)) check(false, `${where}: ${e}`);
    return [["spec.template", obj.spec.template]];
  }
  if (!check(crd, `${where}: no schema for ${obj.apiVersion} ${obj.kind}`)) return [];
  if (!crd(obj)) {
    for (const e of crd.errors) check(false, `${where}: ${e.instancePath || "/"} ${e.message} ${JSON.stringify(e.params)}`);
  }
  if (obj.kind === "JobSet") {
    return (obj.spec.replicatedJobs ?? []).map((rj, i) => {
      for (const e of validateJobTemplateSpec(rj.template)) check(false, `${where}: replicatedJobs[${i}]${e}`);
      return [`spec.replicatedJobs[${i}].template.spec.template`, rj.template?.spec?.template];
    });
  }
  return Object.entries(obj.spec.pytorchReplicaSpecs ?? {}).map(([role, rs]) => {
    for (const e of validatePodTemplateSpec(rs.template)) check(false, `${where}: ${role}${e}`);
    check(rs.template?.spec?.containers?.some((c) => c.name === "pytorch"), `${where}: ${role} has no container named 'pytorch'`);
    return [`spec.pytorchReplicaSpecs.${role}.template`, rs.template];
  });
}

let workloads = 0;
for (const file of deployFiles) {
  for (const obj of loadYamlDocs(file)) {
    const where = `${file} ${describe(obj)}`;
    workloads++;
    for (const [path, tmpl] of podTemplates(obj, where)) {
      const at = `${where} ${path}`;
      if (!check(tmpl?.spec?.containers?.length, `${at}: no containers`)) continue;
      check(clientSelectors.some((sel) => subset(sel, tmpl.metadata?.labels)), `${at}: pod labels are not admitted by the chart's NetworkPolicy (${JSON.stringify(clientSelectors)})`);
      for (const c of tmpl.spec.containers) {
        const env = Object.fromEntries((c.env ?? []).map((e) => [e.name, e]));
        const ep = checkEndpoint(env.ZPS_ENDPOINT?.value, `${at} container ${c.name} ZPS_ENDPOINT`);
        if (ep) check(obj.metadata.namespace === ep.ns, `${at}: runs in namespace ${obj.metadata.namespace}, but the NetworkPolicy admits clients from ${ep.ns} only`);
        if (env.ZPS_TOKEN) {
          const ref = env.ZPS_TOKEN.valueFrom?.secretKeyRef;
          if (check(ref, `${at}: ZPS_TOKEN is not from a Secret`)) checkSecret(ref.name, ref.key, `${at} ZPS_TOKEN`);
        } else if (check(env.ZPS_TOKEN_FILE, `${at} container ${c.name}: neither ZPS_TOKEN nor ZPS_TOKEN_FILE`)) {
          const file = env.ZPS_TOKEN_FILE.value;
          const mount = (c.volumeMounts ?? []).find((m) => file.startsWith(m.mountPath.replace(/\/?$/, "/")));
          const vol = mount && (tmpl.spec.volumes ?? []).find((v) => v.name === mount.name);
          if (check(vol?.secret, `${at}: ZPS_TOKEN_FILE ${file} is not in a mounted Secret`)) {
            checkSecret(vol.secret.secretName, file.slice(mount.mountPath.replace(/\/?$/, "/").length), `${at} ZPS_TOKEN_FILE`);
          }
        }
      }
    }
  }
}
check(workloads === deployFiles.length, "each deploy file must hold exactly one workload");

if (problems.length) {
  for (const p of problems) console.error(`FAIL ${p}`);
  process.exit(1);
}
console.log(`ok: NOTES.txt endpoints ${[...new Set(endpoints)].join(", ")} and ${workloads} worker examples point at rendered Services and Secrets`);
