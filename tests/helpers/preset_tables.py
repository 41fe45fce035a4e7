"""The per-setting tables that tie a paper's presets to its authors' released code: one section
of a doc, a `### ` heading per table (a common one and one per preset file), five cells a row,
the fourth a `lengthgen key` and the fifth its value as a TOML literal. The tests of each paper
(test_looped_paper_presets.py, test_tra_paper_presets.py, ...) check every preset against them,
so a value changed in a preset and not in its table (or the other way round) fails."""
from __future__ import annotations

import re
from pathlib import Path

from lengthgen.config import schema as config

from lengthgen.assembly.runs import new_run_config
from lengthgen.config.schema import tomllib

BOOKKEEPING = {"train.log_interval", "train.checkpoint_interval"}  # logging, not the experiment


def doc_section(doc: Path, section: str) -> str:
    text = doc.read_text(encoding="utf-8")
    start = text.index(f"\n{section}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end == -1 else text[start:end]


def doc_tables(doc: Path, section: str) -> dict[str, dict]:
    """{### heading: {lengthgen key: value}} of every table in the section."""
    tables: dict[str, dict] = {}
    heading = None
    for line in doc_section(doc, section).splitlines():
        if line.startswith("### "):
            heading = line[4:].strip()
            continue
        if not line.startswith("|") or heading is None:
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == "setting" or not cells[0].strip("-"):  # header and separator rows
            continue
        assert len(cells) == 5, f"a row of {heading!r} needs 5 cells: {line}"
        key = re.fullmatch(r"`([\w.]+)`", cells[3])
        value = re.fullmatch(r"`(.+)`", cells[4])
        assert key and value, f"a row of {heading!r} without a `key` and a `value`: {line}"
        table = tables.setdefault(heading, {})
        assert key.group(1) not in table, f"{key.group(1)} twice in {heading!r}"
        table[key.group(1)] = tomllib.loads(f"v = {value.group(1)}")["v"]
    return tables


def expected(tables: dict[str, dict], common: str, preset: str) -> dict:
    """The documented values of one preset (`preset` = its path, as its table's heading names
    it): the common table and its own."""
    own = [table for heading, table in tables.items() if f"`{preset}`" in heading]
    assert len(own) == 1, f"the docs need one table headed with `{preset}`"
    both = tables[common].keys() & own[0].keys()
    assert not both, f"{sorted(both)} in both the common table and {preset}'s"
    return {**tables[common], **own[0]}


def same(a, b) -> bool:
    """Equal and of the same kind: true is not 1, an int may equal a float."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, str) or isinstance(b, str):
        return type(a) is type(b) and a == b
    return a == b


def drift(path: Path, documented: dict, overrides: list[str] = ()) -> list[str]:
    """Every documented key whose value the loaded preset (with `overrides`, e.g. a grid arm's) does not hold."""
    got = config.flat(config.to_dict(new_run_config(path, overrides)))
    return [f"{key}: preset {got.get(key, '<missing>')!r}, docs {value!r}"
            for key, value in documented.items() if key not in got or not same(got[key], value)]


def undocumented(path: Path, documented: dict) -> set[str]:
    """The keys a preset file sets that its tables do not document."""
    return set(config.flat(tomllib.loads(path.read_text(encoding="utf-8")))) - BOOKKEEPING - set(documented)
