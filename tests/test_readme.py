"""README's command list matches the `glm5lib` argparse tree: every verb and every flag it shows exists."""

import argparse
import re
from pathlib import Path

from glm5lib.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _command_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"^## Commands\n\n```text\n(.*?)^```", text, re.S | re.M)
    assert block, "README has no ```text block under '## Commands'"
    return [line.split("  #")[0].strip() for line in block[1].splitlines() if line.startswith("glm5lib ")]


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sp for a in p._actions if isinstance(a, argparse._SubParsersAction) for name, sp in a.choices.items()}


def _flags(p: argparse.ArgumentParser) -> set[str]:
    return {o for a in p._actions for o in a.option_strings}


def _check(parser: argparse.ArgumentParser, words: list[str], line: str) -> list[str]:
    """Problems of one alternative: its verbs walk the tree, its flags belong to the command reached."""
    problems, node, path = [], parser, ["glm5lib"]
    for w in words:
        subs = _subparsers(node)
        if w.startswith("-"):
            if w not in _flags(node):
                problems.append(f"{' '.join(path)}: no flag {w} ({line})")
        elif subs:
            names = w.split("|")  # bench sparse-mla|indexer|all
            missing = [n for n in names if n not in subs]
            if missing:
                problems.append(f"{' '.join(path)}: no command {'|'.join(missing)} ({line})")
                return problems
            node, path = subs[names[0]], path + [names[0]]
    if _subparsers(node):
        problems.append(f"{' '.join(path)}: not a complete command ({line})")
    return problems


WORD = re.compile(r"--?[A-Za-z][\w-]*|[a-z][\w-]*(?:\|[a-z][\w-]*)*")  # flags, verbs (a|b|c); CAPS are metavars


def _alternatives(line: str) -> list[list[str]]:
    """'glm5lib dsa train-tiny | analyze MODEL --layers 0-2' -> [[dsa, train-tiny], [dsa, analyze, --layers]]:
    a ' | ' segment starting with a lower-case word is another command of the same area, one starting with a
    flag is an alternative flag of the same command."""
    segments = re.sub(r"[\[\]()]", " ", line).split(" | ")
    head = WORD.findall(segments[0])[1:]  # without 'glm5lib'
    out = [head]
    for seg in segments[1:]:
        ws = WORD.findall(seg)
        if ws and not ws[0].startswith("-"):
            out.append(head[:1] + ws)
        else:
            out[-1] = out[-1] + ws
    return out


def _verbs_and_flags(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """The leading words that name commands (walking the tree) and every flag; other words are values."""
    keep, node = [], parser
    for w in words:
        if w.startswith("-"):
            keep.append(w)
        elif _subparsers(node):
            keep.append(w)  # must be a command here: _check reports it if not
            node = _subparsers(node).get(w.split("|")[0], argparse.ArgumentParser())
    return keep


def test_readme_commands_exist_in_the_cli():
    parser = build_parser([])
    lines = _command_lines()
    assert len(lines) >= 10
    problems, areas = [], set()
    for line in lines:
        for alt in _alternatives(line):
            problems += _check(parser, _verbs_and_flags(parser, alt), line)
            areas.add(alt[0])
    assert not problems, "\n".join(problems)
    assert set(_subparsers(parser)) <= areas, f"commands missing from README: {set(_subparsers(parser)) - areas}"


def test_a_wrong_readme_line_is_caught():
    parser = build_parser([])
    assert _check(parser, ["gguf", "merge", "--no-such-flag"], "x")
    assert _check(parser, ["gguf", "mergez"], "x")
    assert _check(parser, ["gguf"], "x")
    assert not _check(parser, ["gguf", "merge", "--force", "-q"], "x")
