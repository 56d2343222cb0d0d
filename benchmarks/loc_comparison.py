"""Lines of code to build a weight-sharing SuperNet: AutoTailor against Once-for-All and NNI.

Reproduce (from the repository root; offline, a few seconds: the two configs are compiled)::

    .venv/bin/python benchmarks/loc_comparison.py

It reads the counts stored in ``benchmarks/loc_counts.json``. To count the other repositories again
(git directories of mit-han-lab/once-for-all and microsoft/nni holding the commits stored there;
this rewrites that file and says what changed)::

    .venv/bin/python benchmarks/loc_comparison.py --recount --ofa-git OFA.git --nni-git NNI.git

Counting rule, the same on every side: a line counts if it holds code, i.e. it is not blank, not
only a comment, and not part of a docstring or of another statement that is only a string
(Python: ``tokenize`` and ``ast``; TOML: lines that do not start with ``#``). *Statements* are
Python's logical lines (tokenize NEWLINE tokens, same exclusions; one per TOML line), which do not
depend on how a call is wrapped. Import lines are counted on no side.

* AutoTailor: ``benchmarks/configs/loc_{resnet50,mobilenetv3}.toml`` (spaces like OFA's) plus the
  one line that calls ``at.compile``. Both configs are compiled, to report their spaces.
* Once-for-All (mit-han-lab/once-for-all): every top-level class, function or assignment that
  ``OFAResNets`` / ``OFAMobileNetV3`` reach by name, transitively within the ``ofa`` package
  (whole classes, decorators included), plus the statement of ``ofa/model_zoo.py`` that builds the
  published SuperNet. *elastic* is the part under ``elastic_nn/`` plus that statement: the SuperNet
  code OFA writes on top of its static networks (the ratios use it). *+ static base* adds the
  static network classes and utilities that code reuses (base classes, layers, helpers).
* NNI (microsoft/nni): ``MobileNetV3Space`` of its space hub and what it reaches within
  ``nni/nas/hub``, without ``load_searched_model`` (the searched models' architectures and
  pretrained weights). NNI's mutable framework (``nni.nas.nn``, ``nni.mutable``) is library code,
  like AutoTailor's, and is not counted. NNI has no ResNet space (hub, examples or docs).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import subprocess
import sys
import tokenize
from pathlib import Path

from common import machine, write_results

HERE = Path(__file__).resolve().parent
COUNTS = HERE / "loc_counts.json"
MODELS = {"resnet50": ("ResNet-50", "torchvision:resnet50"),
          "mobilenetv3": ("MobileNetV3-Large", "torchvision:mobilenet_v3_large")}
COMPILE_LINE = 'sn = at.compile("{spec}", torch.zeros(1, 3, 224, 224), config="benchmarks/configs/loc_{key}.toml")'
NOTES = [
    "AutoTailor: the config's lines (its header comments, which say how it maps OFA's space, do not count) "
    "plus the line calling `at.compile`; the framework itself is not counted, as NNI's is not.",
    "OFA, included: the definitions the two network classes reach by name (through `from` imports, "
    "transitively), whole: forward, set/sample/get_active_subnet, get_active_net_config, config and "
    "module_str, re_organize_middle_weights (channel sorting by importance), load_state_dict (maps a static "
    "checkpoint onto the dynamic layers); plus the statement in ofa/model_zoo.py that builds the published "
    "SuperNet with its choices. *elastic*: what lies under elastic_nn/ (the elastic network, dynamic layers, "
    "dynamic ops) and that statement. *+ static base*: also the static network class the elastic one "
    "subclasses and returns as its SubNet (ResNets, MobileNetV3), the static layers (MultiHeadLinearLayer "
    "and ZeroLayer come in through set_layer_from_config's name-to-class table), MyModule/MyNetwork and helpers.",
    "OFA, excluded: SuperNet training (elastic_nn/training/progressive_shrinking.py), BN recalibration "
    "(elastic_nn/utils.py), run managers, data providers, the accuracy predictor, evolutionary search, "
    "latency tables, the OFA ProxylessNAS network, the static ResNet50/ResNet50D/MobileNetV3Large "
    "subclasses, package __init__ files, imports and __all__: the elastic networks do not refer to them, "
    "and AutoTailor's counterparts (tune, evaluate, sensitivity, search) are library code here.",
    "NNI, included: MobileNetV3Space of nni/nas/hub (a TuNAS-style MobileNetV3 space: widths, expand "
    "ratios, kernel sizes 3/5/7, optional squeeze-excite, depth) and the hub helpers it uses "
    "(proxylessnas.py building blocks, make_divisible with its typing overloads, reset_parameters): the "
    "space NNI's developers wrote with Retiarii, i.e. what a user writes for a model the hub lacks (one who "
    "reuses it writes only the `MobileNetV3Space(...)` call, not counted). Excluded: load_searched_model "
    "(lines 278-660: searched architectures and pretrained weights) and utils/pretrained.py, and NNI's "
    "framework (ModelSpace, Repeat, LayerChoice, MutableConv2d, nni.choice).",
    "NNI ResNet-50: NNI has no ResNet space, so there is no public Retiarii ResNet-50 to count; the paper's "
    "Retiarii baselines were 'implemented by us' and are not published.",
    "The spaces are alike, not equal. ResNet-50: OFA's expand ratios 0.2/0.25/0.35 of a block's output "
    "are written as 0.6/0.7/1.0 of ResNet-50's own (AutoTailor's largest SubNet is the model; OFA's "
    "is wider and deeper, depths 4-4-6-4), OFA ties a bottleneck's two inner widths to one ratio where "
    "AutoTailor varies them separately, and OFA's stem skipping has no counterpart. MobileNetV3: AutoTailor "
    "only crops kernels (5x5 to 3x3; no 7x7, 3x3 blocks fixed) and may drop a stage's first block.",
    "The paper counts a git diff against the original model; OFA's *elastic* part is the closest to that. "
    "OFA's code is black-formatted (one argument per line), which is why statements are given too.",
]
NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}


def python_lines(source: str) -> tuple[set[int], set[int]]:
    """(lines holding code, lines ending a statement) of a Python file, string-only statements
    (docstrings) left out."""
    strings = {line for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Expr)
               and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
               for line in range(node.lineno, node.end_lineno + 1)}
    code, ends = set(), set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NEWLINE:
            ends.add(tok.start[0])
        elif tok.type not in NOT_CODE:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return code - strings, ends - strings


def toml_lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#"))


class Mirror:
    """The Python files of ``package`` in a bare git mirror, at ``commit``."""

    def __init__(self, git_dir: str, commit: str, package: str):
        self.git_dir, self.commit = git_dir, commit
        files = self.git("ls-tree", "-r", "--name-only", commit, package).split()
        self.paths = {p[:-3].replace("/", ".").removesuffix(".__init__"): p for p in files if p.endswith(".py")}
        self.trees: dict[str, ast.Module] = {}

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "--git-dir", self.git_dir, *args], check=True, capture_output=True, text=True).stdout

    def tree(self, module: str) -> ast.Module:
        if module not in self.trees:
            self.trees[module] = ast.parse(self.git("show", f"{self.commit}:{self.paths[module]}"))
        return self.trees[module]

    def defs(self, module: str, name: str) -> list[ast.stmt]:
        """The top-level definitions of ``name`` in ``module`` (typing overloads included)."""
        return [n for n in self.tree(module).body if getattr(n, "name", None) == name
                or isinstance(n, ast.Assign) and any(getattr(t, "id", None) == name for t in n.targets)]

    def resolve(self, module: str, name: str, seen: frozenset = frozenset()) -> tuple[str, str] | None:
        """(module, name) of the definition ``name`` means in ``module``, following ``from`` imports;
        None if it is not defined in the package."""
        if module not in self.paths or (module, name) in seen:
            return None
        if self.defs(module, name):
            return module, name
        for node in self.tree(module).body:
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                parent = module.split(".")[:None if self.paths[module].endswith("__init__.py") else -1]
                base = ".".join(parent[:len(parent) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                if alias.name == "*" or (alias.asname or alias.name) == name:
                    found = self.resolve(base, name if alias.name == "*" else alias.name, seen | {(module, name)})
                    if found:
                        return found
        return None

    def closure(self, roots: list[tuple[str, str]], skip: dict[str, list[str]]) -> dict[tuple[str, str], list]:
        """Every definition reached by name from ``roots``, without the methods ``skip`` names per class."""
        todo, done = list(roots), {}
        while todo:
            key = todo.pop()
            if key in done:
                continue
            done[key] = self.defs(*key)
            stack = list(done[key])
            while stack:
                node = stack.pop()
                if isinstance(node, ast.FunctionDef) and node.name in skip.get(key[1], ()):
                    continue
                if isinstance(node, ast.Name) and (found := self.resolve(key[0], node.id)):
                    todo.append(found)
                stack.extend(ast.iter_child_nodes(node))
        return done

    def build_statement(self, path: str, net_id: str) -> ast.stmt:
        """The statement in the ``if net_id == "..."`` branch of ``path`` that builds the SuperNet."""
        module = next(m for m, p in self.paths.items() if p == path)
        for node in ast.walk(self.tree(module)):
            if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and \
                    getattr(node.test.comparators[0], "value", None) == net_id:
                return next(s for s in node.body if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call))
        raise LookupError(f"{path}: no branch for {net_id}")


def spans(nodes: list[ast.stmt], skip_methods: list[str]) -> list[list[int]]:
    """Inclusive line ranges of ``nodes`` (decorators included), without the methods in ``skip_methods``."""
    out = []
    for node in nodes:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        for method in getattr(node, "body", []):
            if isinstance(method, ast.FunctionDef) and method.name in skip_methods:
                first = min([method.lineno] + [d.lineno for d in method.decorator_list])
                out.append([start, first - 1])
                start = method.end_lineno + 1
        out.append([start, node.end_lineno])
    return [s for s in out if s[0] <= s[1]]


def recount(counts: dict, git_dirs: dict[str, str]) -> None:
    """Recompute every side's entries from the mirrors, in place, and print what changed."""
    for key, sides in counts["spaces"].items():
        for side, spec in sides.items():
            if "roots" not in spec:
                continue
            src = counts["sources"][side]
            mirror = Mirror(git_dirs[side], src["commit"], src["package"])
            module_of = {p: m for m, p in mirror.paths.items()}
            roots = [(module_of[path], name) for path, name in spec["roots"]]
            found = sorted(mirror.closure(roots, spec.get("skip", {})).items(),
                           key=lambda kv: (mirror.paths[kv[0][0]], kv[1][0].lineno))
            items = [(mirror.paths[m], name, spans(nodes, spec.get("skip", {}).get(name, []))) for (m, name), nodes in found]
            if "build" in spec:
                stmt = mirror.build_statement(spec["build"]["path"], spec["build"]["net_id"])
                items.insert(0, (spec["build"]["path"], f'{stmt.value.func.id}(...) for "{spec["build"]["net_id"]}"',
                                 [[stmt.lineno, stmt.end_lineno]]))
            entries, lines = [], {}
            for path, name, ranges in items:
                if path not in lines:
                    lines[path] = python_lines(mirror.git("show", f"{src['commit']}:{path}"))
                code, ends = lines[path]
                kept = [n for a, b in ranges for n in range(a, b + 1)]
                part = "space" if "elastic" not in src else "elastic" if path.startswith(tuple(src["elastic"])) else "base"
                entries.append({"path": path, "name": name, "lines": ranges, "part": part,
                                "code_lines": sum(n in code for n in kept), "statements": sum(n in ends for n in kept)})
            change = "unchanged" if entries == spec.get("entries") else f"was {total(spec.get('entries', []))}"
            print(f"recount {key}/{side}: {total(entries)} lines ({change})", file=sys.stderr)
            spec["entries"] = entries


def total(entries: list[dict], parts: tuple = ("elastic", "base", "space"), field: str = "code_lines") -> int:
    return sum(e[field] for e in entries if e["part"] in parts)


def measure(counts: dict) -> dict:
    """Per model: AutoTailor's lines (and its compiled space), OFA's, NNI's, and the ratios."""
    import torch

    import autotailor as at

    out = {}
    for key, (title, spec) in MODELS.items():
        config = HERE / "configs" / f"loc_{key}.toml"
        sn = at.compile(spec, torch.zeros(1, 3, 224, 224), config=str(config))
        ours = toml_lines(config) + 1
        row = {"title": title, "autotailor": {
            "config": str(config.relative_to(HERE.parent)), "config_lines": toml_lines(config),
            "compile_line": COMPILE_LINE.format(spec=spec, key=key), "code_lines": ours, "statements": ours,
            "num_modifications": sn.space.num_modifications, "log10_size": round(sn.space.log10_size, 2)}}
        for side, sp in counts["spaces"][key].items():
            if "entries" not in sp:
                row[side] = {"absent": sp["absent"]}
                continue
            parts = {"ofa": {"elastic": ("elastic",), "with_base": ("elastic", "base")}}.get(side, {"space": ("space",)})
            row[side] = {name: {"code_lines": total(sp["entries"], p), "statements": total(sp["entries"], p, "statements"),
                                "ratio": round(total(sp["entries"], p) / ours, 1),
                                "statement_ratio": round(total(sp["entries"], p, "statements") / ours, 1)}
                         for name, p in parts.items()}
        out[key] = row
    return out


def report(results: dict, counts: dict, command: str) -> str:
    def cell(side: dict, part: str) -> str:
        if "absent" in side:
            return "none"
        c = side[part]
        return f"{c['code_lines']} ({c['statements']})"

    def ratio(side: dict, part: str) -> str:
        return "n/a" if "absent" in side else f"{side[part]['ratio']}x ({side[part]['statement_ratio']}x)"

    src = counts["sources"]
    lines = ["# Lines of code to build a SuperNet: AutoTailor, Once-for-All, NNI", "",
             f"Command: `{command}` (offline, from the stored counts; "
             "`--recount --ofa-git DIR --nni-git DIR` counts the repositories again)", "",
             f"Counting rule: {counts['rule']}", "",
             "Figures are code lines (statements in brackets); a ratio is the other side's count over AutoTailor's.", "",
             "| model | AutoTailor: config + compile call | OFA elastic | OFA + static base | NNI | AutoTailor : OFA elastic | AutoTailor : OFA + base | AutoTailor : NNI |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results.values():
        a, o, n = r["autotailor"], r["ofa"], r["nni"]
        lines.append(f"| {r['title']} | {a['config_lines']} + 1 = {a['code_lines']} | {cell(o, 'elastic')} | "
                     f"{cell(o, 'with_base')} | {cell(n, 'space')} | 1 : {ratio(o, 'elastic')} | "
                     f"1 : {ratio(o, 'with_base')} | 1 : {ratio(n, 'space')} |")
    lines += ["", "AutoTailor spaces (compiled from the configs, 224x224 example input):", ""]
    for r in results.values():
        a = r["autotailor"]
        lines.append(f"* {r['title']}: `{a['config']}`, {a['num_modifications']} modifications, "
                     f"10^{a['log10_size']} SubNets; call: `{a['compile_line']}`")
    lines += ["", "## What was counted", "", *[f"* {note}" for note in NOTES], "",
              "Repositories:", ""]
    lines += [f"* {s['repo']} at commit `{s['commit']}` ({s['committed']}), package `{s['package']}`" for s in src.values()]
    lines += ["", "| model | side | file | definition | line ranges | part | code lines | statements |",
              "|---|---|---|---|---|---|---:|---:|"]
    for key, sides in counts["spaces"].items():
        for side, sp in sides.items():
            if "absent" in sp:
                lines.append(f"| {MODELS[key][0]} | {side} | none | {sp['absent']} | | | | |")
            for e in sp.get("entries", []):
                ranges = ", ".join(f"{a}-{b}" for a, b in e["lines"])
                lines.append(f"| {MODELS[key][0]} | {side} | `{e['path']}` | `{e['name']}` | {ranges} | {e['part']} | "
                             f"{e['code_lines']} | {e['statements']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recount", action="store_true", help="count the repositories again from bare git mirrors")
    parser.add_argument("--ofa-git", help="git directory of mit-han-lab/once-for-all (with --recount)")
    parser.add_argument("--nni-git", help="git directory of microsoft/nni (with --recount)")
    args = parser.parse_args()
    counts = json.loads(COUNTS.read_text())
    if args.recount:
        if not (args.ofa_git and args.nni_git):
            parser.error("--recount needs --ofa-git and --nni-git")
        recount(counts, {"ofa": args.ofa_git, "nni": args.nni_git})
        text = json.dumps(counts, indent=1)  # then one line per counted definition:
        COUNTS.write_text(re.sub(r'\{\n\s+"path"[^{}]*\}', lambda m: json.dumps(json.loads(m.group(0))), text) + "\n")
    command = ".venv/bin/python benchmarks/loc_comparison.py"
    results = measure(counts)
    data = {"command": command, "machine": machine("torch", "torchvision"), "rule": counts["rule"],
            "sources": counts["sources"], "models": results, "counted": counts["spaces"], "notes": NOTES}
    write_results(HERE / "results", "loc_comparison", data, report(results, counts, command))


if __name__ == "__main__":
    main()
