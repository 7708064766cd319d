"""Each option is declared once (a field of Options); the packaged defaults, the schema, the
README table, the CLI flags and the worker flags are made from it and stay in step."""

from __future__ import annotations

import dask.config
import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from spillway.options import docs as config_docs
from spillway.options.errors import OptionsError
from spillway.options.settings import OPTIONS, Options, fields, load_defaults


def load_schema() -> dict:
    """The committed schema, as an editor reads it."""
    return yaml.safe_load(config_docs.SCHEMA_FILE.read_text())


def test_committed_files_are_the_generated_ones():
    files = config_docs.generated()
    assert config_docs.README in files, "the README's configuration table is checked in a source checkout"
    stale = config_docs.stale(files)
    assert not stale, f"{', '.join(map(str, stale))} differ from the option declarations: run `{config_docs.COMMAND}`"


def test_check_names_a_stale_file_and_write_mends_it(tmp_path, monkeypatch, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"# intro\n\n{config_docs.BEGIN}\n| old table |\n{config_docs.END}\n\nmore text\n")
    monkeypatch.setattr(config_docs, "README", readme)
    monkeypatch.setattr(config_docs, "DEFAULTS_FILE", tmp_path / "config.yaml")
    monkeypatch.setattr(config_docs, "SCHEMA_FILE", tmp_path / "config_schema.yaml")
    (tmp_path / "config.yaml").write_text(config_docs.defaults_yaml())

    assert config_docs.main([]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"{path}: differs from the option declarations; run `{config_docs.COMMAND}`"
                     for path in (tmp_path / "config_schema.yaml", readme)]

    assert config_docs.main(["--write"]) == 0
    assert config_docs.main([]) == 0
    text = readme.read_text()
    assert text.startswith("# intro\n") and text.endswith("\nmore text\n")
    assert config_docs.readme_block() in text
    assert (tmp_path / "config_schema.yaml").read_text() == config_docs.schema_yaml()


def test_defaults_validate_against_schema():
    jsonschema.validate(load_defaults(), load_schema())
    jsonschema.Draft202012Validator.check_schema(load_schema())


def test_same_keys_everywhere():
    defaults = set(load_defaults())
    documented = set(load_schema()["properties"])
    option_fields = {f.replace("_", "-") for f in fields()}
    assert defaults == documented == option_fields == {o.key for o in OPTIONS}


def test_every_option_is_described_on_one_line():
    for o in OPTIONS:
        assert o.help.strip() and "\n" not in o.help and o.help == o.help.strip(), o.key


def test_yaml_defaults_equal_dataclass_defaults():
    built = Options.resolve().as_config()
    plain = Options().as_config()
    assert built == plain == load_defaults()


def test_schema_rejects_unknown_and_mistyped_keys():
    schema = load_schema()
    bad = dict(load_defaults(), **{"rmm-pool-sise": "1GB"})
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(bad))
    bad = dict(load_defaults(), **{"threads-per-worker": "many"})
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(bad))


def _schema_allows(key: str, value) -> bool:
    validator = jsonschema.Draft202012Validator(load_schema())
    return not list(validator.iter_errors(dict(load_defaults(), **{key: value})))


def _parser_allows(o, value) -> bool:
    try:
        o.parse(value, o.key)
    except OptionsError:
        return False
    return True


@pytest.mark.parametrize("o", [o for o in OPTIONS if "minimum" in o.parse.schema or "enum" in o.parse.schema],
                         ids=lambda o: o.key)
def test_schema_bounds_are_the_parsers(o):
    """The schema's bounds and choices come from the parser's own arguments: a value just
    outside is refused by both, the bound itself taken by both."""
    schema = o.parse.schema
    edges = []
    if "minimum" in schema:
        edges += [(schema["minimum"], True), (schema["minimum"] - 1, False)]
    if "maximum" in schema:
        edges += [(schema["maximum"], True), (schema["maximum"] + 1, False)]
    for choice in schema.get("enum", []):
        edges += [(choice, True), (choice + "-not", False)]
    for value, ok in edges:
        assert _schema_allows(o.key, value) is ok, (o.key, value)
        assert _parser_allows(o, value) is ok, (o.key, value)


def test_schema_types_take_each_default_and_null_where_the_parser_does():
    for o in OPTIONS:
        assert _parser_allows(o, o.config_default), o.key
        assert _schema_allows(o.key, None) == ("null" in o.parse.schema["type"]), o.key
        if "null" in o.parse.schema["type"]:
            assert o.parse(None, o.key) is None, o.key


def test_every_option_has_its_flag_with_the_declared_help():
    from spillway.cli import main

    help_text = CliRunner().invoke(main, ["config", "--help"], terminal_width=10_000).output
    for o in OPTIONS:
        flag = f"{o.flag} / --no-{o.key}" if o.switch else f"{o.flag} VALUE"
        assert flag in help_text, o.key
    params = {p.name: p for p in main.commands["config"].params}
    assert all(params[o.name].help == o.help for o in OPTIONS)


def test_the_readme_table_lists_switches_with_their_negation():
    table = config_docs.config_table()
    assert "| `nvlink` | `--nvlink/--no-nvlink` | `true` |" in table
    assert "| `rmm-pool-size` | `--rmm-pool-size` | `auto` |" in table
    assert table.count("\n") == len(OPTIONS) + 1


def test_the_parsers_take_what_dask_reads_from_the_environment_and_the_schema_would_not(monkeypatch):
    """Why the schema is not checked at run time: dask reads DASK_SPILLWAY__DEVICES=0,1 as a
    tuple and DASK_SPILLWAY__NVLINK=off as a string; the parsers take both."""
    monkeypatch.setenv("DASK_SPILLWAY__DEVICES", "0,1")
    monkeypatch.setenv("DASK_SPILLWAY__NVLINK", "off")
    options = Options.resolve()
    assert options.devices == (0, 1) and options.nvlink is False
    read = dask.config.collect_env({"DASK_SPILLWAY__DEVICES": "0,1", "DASK_SPILLWAY__NVLINK": "off"})["spillway"]
    assert not _schema_allows("devices", read["devices"]) and not _schema_allows("nvlink", read["nvlink"])
