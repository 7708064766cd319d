"""The YAML defaults, the schema, the options object and the README table stay in step."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema

from spillway.service.config_docs import BEGIN, END, readme_block
from spillway.service.options import Options, fields, load_defaults, load_schema

README = Path(__file__).resolve().parents[2] / "README.md"


def test_defaults_validate_against_schema():
    jsonschema.validate(load_defaults(), load_schema())


def test_same_keys_everywhere():
    defaults = set(load_defaults())
    documented = set(load_schema()["properties"])
    option_fields = {f.replace("_", "-") for f in fields()}
    assert defaults == documented == option_fields


def test_every_key_is_described():
    for key, spec in load_schema()["properties"].items():
        assert spec.get("description", "").strip(), key


def test_yaml_defaults_equal_dataclass_defaults():
    built = Options.resolve().as_config()
    plain = Options().as_config()
    assert built == plain


def test_schema_rejects_unknown_and_mistyped_keys():
    schema = load_schema()
    bad = dict(load_defaults(), **{"rmm-pool-sise": "1GB"})
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(bad))
    bad = dict(load_defaults(), **{"threads-per-worker": "many"})
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(bad))


def test_readme_table_is_generated_from_schema():
    text = README.read_text()
    block = re.search(re.escape(BEGIN) + ".*?" + re.escape(END), text, flags=re.S)
    assert block, "README lacks the configuration table markers"
    assert block.group(0) == readme_block(), (
        "README configuration table is stale: regenerate it from spillway.service.config_docs.readme_block()"
    )
