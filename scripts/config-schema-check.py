#!/usr/bin/env python3
"""Validates Portico configuration files against `portico schema`'s JSON Schema with an
independent validator (Python's jsonschema, Draft 2020-12), the way an editor would.

    portico schema > portico.schema.json
    scripts/config-schema-check.py --schema portico.schema.json config/portico.yaml config/examples/*.yaml

Prints `FILE: valid` or one line per problem (`FILE: key/path: message`); exits 1 when a file
does not validate, 2 when the schema itself is not a valid Draft 2020-12 schema.

YAML is read the way Portico reads it (YAML 1.2 scalars): only true/false are booleans, so a key
such as retry's `on:` stays the string "on" (PyYAML's default YAML 1.1 rules would make it
True). Needs `pip install jsonschema pyyaml` (scripts/test puts both in .build/test-python).
"""
import argparse
import json
import re
import sys

import jsonschema
import yaml


class Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2's booleans: yes/no/on/off stay strings."""


Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schema", required=True, help="the JSON Schema printed by `portico schema`")
    parser.add_argument("files", nargs="+", help="YAML configuration files")
    args = parser.parse_args()

    with open(args.schema, encoding="utf-8") as handle:
        schema = json.load(handle)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as error:
        print(f"{args.schema}: not a valid Draft 2020-12 schema: {error.message}")
        return 2
    validator = jsonschema.Draft202012Validator(schema)

    failed = False
    for path in args.files:
        with open(path, encoding="utf-8") as handle:
            document = yaml.load(handle, Loader=Yaml12Loader)
        errors = sorted(validator.iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path])
        if not errors:
            print(f"{path}: valid")
            continue
        failed = True
        for error in errors:
            # The deepest reasons of an anyOf/allOf, so the line names the key that is wrong.
            leaves = [error]
            while leaves and all(leaf.context for leaf in leaves):
                leaves = [child for leaf in leaves for child in leaf.context]
            location = "/".join(str(part) for part in error.absolute_path) or "(root)"
            detail = "; ".join(sorted({leaf.message for leaf in leaves if leaf is not error}))[:400]
            print(f"{path}: {location}: {error.message[:300]}" + (f" ({detail})" if detail else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
