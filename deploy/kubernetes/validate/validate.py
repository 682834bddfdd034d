#!/usr/bin/env python3
"""Validates Kubernetes objects against the API's schemas, offline.

Usage: validate.py [--kubernetes-version X.Y] FILE.yaml...

Each FILE is multi-document YAML (e.g. the output of `kubectl kustomize`).
Prints one line per object, `FILE: Kind/name: valid` or
`FILE: Kind/name: INVALID: <path>: <message>`, then
`validate: N valid, M invalid`. Exits 1 when any object is invalid, of an
unknown apiVersion/kind, or a YAML error, or when no object was checked.

Built-in kinds are checked with kubernetes-validate (PyPI, pinned 1.37.0)
against the schemas of Kubernetes KUBERNETES_VERSION (1.33 unless
--kubernetes-version says otherwise), strict: unknown fields are refused.

The custom resources the manifests use (cert-manager's Certificate and
Issuer, the Prometheus Operator's PodMonitor) are checked with jsonschema
against the openAPIV3Schema of their CRDs, kept in crds/ (see README.md for
the releases they come from). As the API server prunes unknown fields of a
structural schema, every object schema that lists properties and neither
sets additionalProperties nor x-kubernetes-preserve-unknown-fields is closed
(additionalProperties: false) when loaded, so unknown fields are refused
here. Their metadata is checked as the ObjectMeta of a built-in kind.
CEL rules (x-kubernetes-validations) and formats are not evaluated.
"""

import argparse
import json
import os
import re
import sys

import jsonschema
import kubernetes_validate
import yaml

# The Kubernetes version whose API schemas built-in kinds are checked against.
KUBERNETES_VERSION = "1.33"
CRD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crds")
# (apiVersion, kind) -> the file in crds/ holding its CRD's openAPIV3Schema.
CRDS = {
    ("cert-manager.io/v1", "Certificate"): "cert-manager.io_v1_certificate.json",
    ("cert-manager.io/v1", "Issuer"): "cert-manager.io_v1_issuer.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_v1_podmonitor.json",
}
MAX_MESSAGE = 400


def close_schema(schema):
    """Refuses unknown properties where the API server would prune them (structural schemas)."""
    if not isinstance(schema, dict):
        return
    if schema.get("x-kubernetes-embedded-resource") and "properties" in schema:
        for field in ("apiVersion", "kind"):
            schema["properties"].setdefault(field, {"type": "string"})
        schema["properties"].setdefault("metadata", {"type": "object"})
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        schema["additionalProperties"] = False
    if schema.get("nullable") and isinstance(schema.get("type"), str):
        schema["type"] = [schema["type"], "null"]
    for sub in schema.get("properties", {}).values():
        close_schema(sub)
    items = schema.get("items")
    for sub in items if isinstance(items, list) else [items]:
        close_schema(sub)
    close_schema(schema.get("additionalProperties"))


_crd_validators = {}


def crd_validator(name):
    if name not in _crd_validators:
        with open(os.path.join(CRD_DIR, name)) as f:
            schema = json.load(f)
        close_schema(schema)
        # OpenAPI 3.0 schema objects are closest to JSON Schema draft 4
        # (e.g. a boolean exclusiveMaximum).
        _crd_validators[name] = jsonschema.Draft4Validator(schema)
    return _crd_validators[name]


def json_path(path):
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (("." if out else "") + str(p))
    return out or "(top level)"


def describe(e):
    message = e.message if len(e.message) <= MAX_MESSAGE else e.message[:MAX_MESSAGE] + "..."
    return f"{json_path(e.absolute_path)}: {message}"


def validate_object(obj, version):
    """None when `obj` is valid, else why not."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if not all(isinstance(k, str) and k for k in key):
        return "apiVersion and kind must be non-empty strings"
    if key in CRDS:
        metadata = obj.get("metadata")
        if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str) or not metadata["name"]:
            return "metadata.name: must be a non-empty string"
        # The same ObjectMeta schema as a built-in kind's (unknown fields refused).
        try:
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata},
                                         version, strict=True)
        except kubernetes_validate.ValidationError as e:
            return describe(e)
        error = jsonschema.exceptions.best_match(crd_validator(CRDS[key]).iter_errors(obj))
        return None if error is None else describe(error)
    try:
        used = kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return f"unknown apiVersion/kind {key[0]} {key[1]}"
    except kubernetes_validate.ValidationError as e:
        return describe(e)
    if used != version:
        return f"checked against Kubernetes {used}, not {version}"
    return None


class Loader(yaml.SafeLoader):
    pass


# A plain `=` is YAML 1.1's value tag, which PyYAML cannot construct.
Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def yaml_loader(text, file):
    loader = Loader(text)
    loader.name = file  # error marks name the file
    return loader


def loader_documents(loader):
    try:
        while loader.check_data():
            yield loader.get_data()
    finally:
        loader.dispose()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubernetes-version", default=KUBERNETES_VERSION,
                    help=f"X.Y, a version kubernetes-validate bundles (default {KUBERNETES_VERSION})")
    ap.add_argument("files", nargs="+", metavar="FILE.yaml")
    args = ap.parse_args()
    version = args.kubernetes_version.lstrip("v")
    bundled = list(dict.fromkeys(re.sub(r"^(\d+\.\d+).*", r"\1", v)
                                 for v in kubernetes_validate.utils.all_versions()))
    if version not in bundled:
        print(f"validate: Kubernetes {version} is not one kubernetes-validate "
              f"{kubernetes_validate.__version__} bundles ({', '.join(bundled)})")
        return 2
    valid = invalid = 0
    for file in args.files:
        try:
            with open(file) as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            print(f"{file}: cannot read: {e}")
            invalid += 1
            continue
        loader = yaml_loader(text, file)
        docs = loader_documents(loader)
        while True:
            try:
                obj = next(docs)
            except StopIteration:
                break
            except yaml.YAMLError as e:
                print(f"{file}: YAML error: {' '.join(str(e).split())}")
                invalid += 1
                break
            if obj is None:
                continue
            if not isinstance(obj, dict):
                print(f"{file}: a document is a {type(obj).__name__}, not an object")
                invalid += 1
                continue
            metadata = obj.get("metadata")
            name = metadata.get("name") if isinstance(metadata, dict) else None
            what = f"{file}: {obj.get('kind')}/{name}"
            why = validate_object(obj, version)
            if why is None:
                print(f"{what}: valid")
                valid += 1
            else:
                print(f"{what}: INVALID: {why}")
                invalid += 1
    print(f"validate: {valid} valid, {invalid} invalid")
    return 1 if invalid or not valid else 0


if __name__ == "__main__":
    sys.exit(main())
