// Validates Kubernetes objects against the API's JSON schemas, offline.
// Usage: node validate.mjs FILE.yaml...   (multi-document YAML, e.g. the
// output of `kubectl kustomize`). Prints one line per object; exits 1 when
// any object is invalid or of an unknown apiVersion/kind.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

let failures = 0;
let checked = 0;
for (const file of process.argv.slice(2)) {
  const docs = parseAllDocuments(readFileSync(file, "utf8"));
  for (const doc of docs) {
    if (doc.errors.length > 0) {
      console.log(`${file}: YAML error: ${doc.errors[0].message}`);
      failures++;
      continue;
    }
    const obj = doc.toJS();
    if (obj === null) continue;
    const what = `${file}: ${obj.kind}/${obj.metadata?.name}`;
    // Core and built-in API groups from kubernetes-models; the CRDs of the
    // prometheus-operator (PodMonitor, PrometheusRule) and of cert-manager
    // (Certificate, Issuer) from their packages.
    const group = String(obj.apiVersion).split("/")[0];
    const pkg = {
      "monitoring.coreos.com": "@kubernetes-models/prometheus-operator",
      "cert-manager.io": "@kubernetes-models/cert-manager",
    }[group] ?? "kubernetes-models";
    let Model;
    try {
      const mod = await import(`${pkg}/${obj.apiVersion}`);
      Model = mod[obj.kind];
    } catch (e) {
      Model = undefined;
    }
    if (Model === undefined) {
      console.log(`${what}: unknown apiVersion/kind ${obj.apiVersion} ${obj.kind}`);
      failures++;
      continue;
    }
    try {
      new Model(obj).validate();
      console.log(`${what}: valid`);
      checked++;
    } catch (e) {
      console.log(`${what}: INVALID: ${e.message}`);
      failures++;
    }
  }
}
console.log(`validate: ${checked} valid, ${failures} invalid`);
process.exit(failures > 0 || checked === 0 ? 1 : 0);
