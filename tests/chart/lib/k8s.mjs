// Kubernetes schema validation for rendered manifests, with unknown fields rejected.
//
// kubernetes-models and @kubernetes-models/prometheus-operator ship precompiled ajv validators of
// the upstream OpenAPI schemas. Those validators check types, enums, required fields and formats,
// but, like the API server without strict field validation, they ignore fields that the schema does
// not name. The API server would then drop such a field silently (a misspelled `readinesProbe` means
// no probe at all), so we reject them here.
//
// How: the object is handed to the validator behind a Proxy that records every property the
// validator reads. A generated validator reads each property its schema declares on every object it
// checks, and enumerates the keys of map-like objects (labels, resources.limits). So, after it ran:
//   - an object whose keys were enumerated is a map: any key is allowed;
//   - an object of which nothing was read has a free-form schema (x-kubernetes-preserve-unknown-fields):
//     any key is allowed;
//   - on every other object, a key the validator never read is unknown to the schema: an error.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

import * as coreV1 from "kubernetes-models/v1";
import * as appsV1 from "kubernetes-models/apps/v1";
import * as batchV1 from "kubernetes-models/batch/v1";
import * as policyV1 from "kubernetes-models/policy/v1";
import * as networkingV1 from "kubernetes-models/networking.k8s.io/v1";
import * as rbacV1 from "kubernetes-models/rbac.authorization.k8s.io/v1";
import * as monitoringV1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const MODELS = {
  v1: coreV1,
  "apps/v1": appsV1,
  "batch/v1": batchV1,
  "policy/v1": policyV1,
  "networking.k8s.io/v1": networkingV1,
  "rbac.authorization.k8s.io/v1": rbacV1,
  "monitoring.coreos.com/v1": monitoringV1,
};

/** The kubernetes-models class for apiVersion/kind, or undefined. */
export function modelFor(apiVersion, kind) {
  const mod = MODELS[apiVersion];
  const cls = mod && mod[kind];
  return typeof cls === "function" && typeof cls.prototype.validate === "function" ? cls : undefined;
}

/** Wraps `root` so that reads and key enumerations are recorded per object. */
function track(root) {
  const records = [];
  const proxies = new WeakMap();
  const wrap = (value, path) => {
    if (value === null || typeof value !== "object") return value;
    if (proxies.has(value)) return proxies.get(value);
    const rec = { target: value, path, read: new Set(), enumerated: false };
    records.push(rec);
    const proxy = new Proxy(value, {
      get(t, key, receiver) {
        const v = Reflect.get(t, key, receiver);
        if (typeof key !== "string") return v;
        rec.read.add(key);
        return Object.prototype.hasOwnProperty.call(t, key) ? wrap(v, `${path}/${key}`) : v;
      },
      has(t, key) {
        if (typeof key === "string") rec.read.add(key);
        return Reflect.has(t, key);
      },
      getOwnPropertyDescriptor(t, key) {
        if (typeof key === "string" && !rec.enumerated) rec.read.add(key);
        return Reflect.getOwnPropertyDescriptor(t, key);
      },
      ownKeys(t) {
        rec.enumerated = true;
        return Reflect.ownKeys(t);
      },
    });
    proxies.set(value, proxy);
    return proxy;
  };
  return { proxy: wrap(root, ""), records };
}

/**
 * Validates one object with a kubernetes-models class. Returns a list of error strings (empty when
 * valid): schema errors as the library words them, and one line per unknown field.
 */
export function validateWith(cls, obj) {
  const errors = [];
  const { proxy, records } = track(obj);
  try {
    cls.prototype.validate.call(proxy);
  } catch (e) {
    if (!e || !Array.isArray(e.errors)) throw e;
    errors.push(`schema: ${e.message}`);
  }
  for (const rec of records) {
    if (Array.isArray(rec.target) || rec.enumerated || rec.read.size === 0) continue;
    for (const key of Object.keys(rec.target)) {
      if (!rec.read.has(key)) errors.push(`unknown field: ${rec.path}/${key}`);
    }
  }
  return errors;
}

/** Validates a top-level Kubernetes object by its apiVersion and kind. */
export function validateObject(obj) {
  const cls = modelFor(obj.apiVersion, obj.kind);
  if (!cls) return [`no schema known for apiVersion=${obj.apiVersion} kind=${obj.kind}`];
  return validateWith(cls, obj);
}

/** A PodTemplateSpec, validated as the template of a PodTemplate object. */
export function validatePodTemplateSpec(template) {
  return validateWith(coreV1.PodTemplate, {
    apiVersion: "v1",
    kind: "PodTemplate",
    metadata: { name: "check" },
    template,
  }).map((e) => e.replace("/template", "(pod template)"));
}

/** A JobTemplateSpec, validated as the jobTemplate of a CronJob. */
export function validateJobTemplateSpec(jobTemplate) {
  return validateWith(batchV1.CronJob, {
    apiVersion: "batch/v1",
    kind: "CronJob",
    metadata: { name: "check" },
    spec: { schedule: "0 0 * * *", jobTemplate },
  }).map((e) => e.replace("/spec/jobTemplate", "(job template)"));
}

/** Parses a multi-document YAML file; throws on a YAML error. Skips empty documents. */
export function loadYamlDocs(file) {
  const docs = parseAllDocuments(readFileSync(file, "utf8"), { uniqueKeys: true });
  const out = [];
  for (const doc of docs) {
    if (doc.errors.length) throw new Error(`${file}: ${doc.errors.map((e) => e.message).join("; ")}`);
    const value = doc.toJS({ maxAliasCount: 0 });
    if (value !== null && value !== undefined) out.push(value);
  }
  return out;
}

export function describe(obj) {
  return `${obj.kind}/${obj.metadata?.name ?? "?"}`;
}
