"""Check `TOUCHES` against a vLLM source tree by reading it (``ast``), without importing it.

So a release whose compiled parts cannot load here (vLLM 0.33 needs torch 2.14 and
CUDA) is still checked: ``python -m integrations.vllm_v1.vllm_surface.check DIR``,
where ``DIR`` holds the ``vllm`` package, prints each problem and exits 1 if any.
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

from integrations.vllm_v1.vllm_surface.touches import TOUCHES, Touch

Found = tuple[str, ast.AST]
"""(module, node) of a definition."""


def problems(root: Path, touches: tuple[Touch, ...] = TOUCHES) -> list[str]:
    """Every touch that ``root``'s vLLM does not satisfy, one sentence each."""
    finder = _Finder(root.resolve())
    return [p for touch in touches if (p := finder.problem(touch))]


class _Finder:
    def __init__(self, root: Path) -> None:
        self.root = root

    @cache  # noqa: B019 - one finder per check
    def tree(self, module: str) -> ast.Module | None:
        base = self.root.joinpath(*module.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return ast.parse(path.read_text(), str(path))
        return None

    def problem(self, touch: Touch) -> str | None:
        owner, _, member = touch.name.partition(".")
        found = self.top_level(touch.module, owner)
        where = f"{touch.module}.{touch.name} ({touch.use})"
        if found is None:
            return f"{where}: {owner} not found"
        if member:
            if not isinstance(found[1], ast.ClassDef):
                return f"{where}: {owner} is not a class"
            node = self.member(found, member)
            if node is None:
                return f"{where}: no member {member}"
        else:
            node = found[1]
        if touch.params is None:
            return None
        if isinstance(node, ast.ClassDef):
            init = self.member((found[0], node), "__init__")
            if init is None:
                return None  # a dataclass-like class: fields are its parameters
            node = init
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return f"{where}: not a function"
        return _signature_problem(where, node, touch.params, in_class=bool(member) or
                                  isinstance(found[1], ast.ClassDef))

    def top_level(self, module: str, name: str, depth: int = 0) -> Found | None:
        tree = self.tree(module)
        if tree is None or depth > 8:
            return None
        lazy = False
        for node in _walk_top(tree.body):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and \
                    node.name == name:
                return module, node
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return module, node
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                    node.target.id == name:
                return module, node
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(module, node, self.tree(module) is not None and
                                           self._is_package(module))
                        found = self.top_level(source, alias.name, depth + 1)
                        if found is not None:
                            return found
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                lazy = True
        if lazy and name in ast.unparse(tree):  # a lazily exported name
            return module, ast.Pass()
        return None

    def _is_package(self, module: str) -> bool:
        return (self.root.joinpath(*module.split(".")) / "__init__.py").is_file()

    def member(self, found: Found, name: str, depth: int = 0) -> ast.AST | None:
        module, cls = found
        assert isinstance(cls, ast.ClassDef)
        for node in cls.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return node
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                    node.target.id == name:
                return node
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return node
        for node in ast.walk(cls):  # self.<name> = ... in any method
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else [])
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == name and \
                        isinstance(target.value, ast.Name) and target.value.id == "self":
                    return node
        if depth > 8:
            return None
        for base in cls.bases:
            base_name = base.id if isinstance(base, ast.Name) else None
            if base_name is None:
                continue
            parent = self.top_level(module, base_name)
            if parent is not None and isinstance(parent[1], ast.ClassDef):
                node = self.member(parent, name, depth + 1)
                if node is not None:
                    return node
        return None


def _walk_top(body: list[ast.stmt]):
    """Top-level statements, looking inside ``if``/``try`` blocks (version switches)."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            yield from _walk_top(node.body + node.orelse + getattr(node, "finalbody", []) +
                                 [s for h in getattr(node, "handlers", []) for s in h.body])


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    base = parts[:keep]
    return ".".join(base + ([node.module] if node.module else []))


def _signature_problem(where: str, node: ast.FunctionDef | ast.AsyncFunctionDef,
                       expected: tuple[str, ...], in_class: bool) -> str | None:
    args = node.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    is_static = any(isinstance(d, ast.Name) and d.id == "staticmethod"
                    for d in node.decorator_list)
    if in_class and not is_static and positional:
        positional = positional[1:]
    names = positional + [a.arg for a in args.kwonlyargs]
    if names[:len(expected)] != list(expected) and positional[:len(expected)] != list(expected):
        return f"{where}: parameters {names}, expected to start with {list(expected)}"
    required_positional = len(positional) - len(args.defaults)
    if required_positional > len(expected):
        return f"{where}: parameter {positional[len(expected)]!r} has no default"
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        if default is None and arg.arg not in expected:
            return f"{where}: keyword-only parameter {arg.arg!r} has no default"
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m integrations.vllm_v1.vllm_surface.check DIR", file=sys.stderr)
        return 2
    found = problems(Path(args[0]))
    for line in found:
        print(line)
    print(f"{len(TOUCHES)} touches checked, {len(found)} problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
