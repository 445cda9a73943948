#!/usr/bin/env python3
"""Import circles between the modules of a crate (docs/ARCHITECTURE.md, "Layers and who
owns what").

    ci/modcycles.py SRC_DIR [SRC_DIR...]   (each a crate's src/, its root lib.rs)
    ci/modcycles.py --self-test            (finds the circles of a crate made for it)

Modules are files (`a/mod.rs` and `a.rs` are `a`). Module A depends on module B when code
in A names an item of B: a `use` of `crate::`, `super::` or `self::` paths, or such a path
written inline; a name that a module only re-exports (`pub use b::Item`, or a private
`use`) counts as the module it comes from. Comments, string literals, `#[cfg(test)]`
modules and unit-test files (`tests.rs`, `tests/`) are not read, nor `src/bin` (crates of
their own).

Dependencies are looked at between siblings: A depending on B is an edge from the child
of their nearest common ancestor that holds A to the one that holds B (a parent naming its
children, and a child naming its parent's own items, are not edges). Every strongly
connected set of two or more siblings is a circle: it is printed with one place in the
code per edge, and the exit status is 1. No circle: one line, status 0.
"""
import os
import re
import sys

USE = re.compile(r"\b(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
INLINE = re.compile(r"\b((?:crate|super|self)(?:\s*::\s*\w+)+)")


def strip(src):
    """Source with comments and string/char literals blanked (line numbers kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', src[i:]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = src.find('"' + m.group(1), i + len(m.group(0)))
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", src[i : j + 1]))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", src[i:]):
            m = re.match(r"'(\\.|[^\\'])'", src[i:])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_mods(src):
    """`#[cfg(test)] mod x { ... }` blanked (brace-matched) and `#[cfg(test)] mod x;` lines."""
    for m in reversed(list(re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", src))):
        depth, j = 1, m.end()
        while j < len(src) and depth:
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            j += 1
        src = src[: m.start()] + re.sub(r"[^\n]", " ", src[m.start() : j]) + src[j:]
    return src


def expand(tree):
    """`a::{b, c::{d, e as f}}` -> [(['a','b'], 'b'), (['a','c','d'], 'd'), (['a','c','e'], 'f')]."""
    tree = re.sub(r"\s+", " ", tree).strip()
    out = []

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        parts.append(cur)
        return [p.strip() for p in parts if p.strip()]

    def go(prefix, s):
        i = s.find("{")
        if i >= 0 and s.endswith("}"):
            head = [p for p in s[:i].replace(" ", "").split("::") if p]
            for part in split_top(s[i + 1 : -1]):
                go(prefix + head, part)
            return
        alias = None
        m = re.match(r"(.*?)\s+as\s+(\w+)$", s)
        if m:
            s, alias = m.group(1), m.group(2)
        segs = [p for p in s.replace(" ", "").split("::") if p]
        if segs and segs[-1] == "self":
            segs = segs[:-1]
        if segs:
            out.append((prefix + segs, alias or segs[-1]))

    go([], tree)
    return out


def load(root):
    mods = {}
    for dp, dn, fn in os.walk(root):
        rel_dir = os.path.relpath(dp, root)
        parts = [] if rel_dir == "." else rel_dir.split(os.sep)
        if parts[:1] == ["bin"] or "tests" in parts:
            dn[:] = []
            continue
        for f in fn:
            if not f.endswith(".rs") or f == "tests.rs":
                continue
            name = f[:-3]
            path = tuple(parts if name in ("mod", "lib") else parts + [name])
            if not parts and name == "main":
                continue
            mods[path] = os.path.join(dp, f)
    return mods


def analyse(root):
    mods = load(root)
    text = {}
    for m, p in mods.items():
        with open(p, errors="replace") as fh:
            text[m] = drop_test_mods(strip(fh.read()))

    def base_of(cur, segs):
        """(absolute segments, or None for a path outside the crate)."""
        if not segs:
            return None
        if segs[0] == "crate":
            return segs[1:]
        if segs[0] in ("super", "self"):
            b = list(cur)
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    b = b[:-1]
                segs = segs[1:]
            return b + segs
        # A path relative to the current module (a child, or a name it imports).
        return list(cur) + segs

    imports = {m: {} for m in mods}
    for m in mods:
        for um in USE.finditer(text[m]):
            for segs, name in expand(um.group(1)):
                if segs[0] in ("crate", "super", "self") or tuple(list(m) + segs[:1]) in mods:
                    imports[m][name] = base_of(m, segs)

    def resolve(full, hops=0):
        for k in range(len(full), -1, -1):
            if tuple(full[:k]) in mods:
                mod, rest = tuple(full[:k]), full[k:]
                if rest and hops < 8 and rest[0] in imports[mod]:
                    tgt = imports[mod][rest[0]]
                    if tgt is not None and tgt != full:
                        return resolve(tgt + rest[1:], hops + 1)
                return mod
        return None

    edges = {}
    for m in mods:
        src = text[m]
        refs = []
        for um in USE.finditer(src):
            line = src.count("\n", 0, um.start()) + 1
            for segs, _ in expand(um.group(1)):
                if segs[0] in ("crate", "super", "self") or tuple(list(m) + segs[:1]) in mods:
                    refs.append((segs, line))
        for im in INLINE.finditer(src):
            line = src.count("\n", 0, im.start()) + 1
            refs.append(([s for s in re.split(r"\s*::\s*", im.group(1)) if s], line))
        for segs, line in refs:
            full = base_of(m, segs)
            if full is None:
                continue
            t = resolve(full)
            if t is None or t == m:
                continue
            k = 0
            while k < min(len(m), len(t)) and m[k] == t[k]:
                k += 1
            if k == len(m) or k == len(t):
                continue  # ancestor or descendant
            a, b = m[: k + 1], t[: k + 1]
            edges.setdefault((m[:k], a, b), (mods[m], line))
    return edges


def sccs(nodes, adj):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def self_test():
    """A crate with a circle through a re-export and one through a `use` group, beside
    pairs that are not circles (a comment, a string, a test module, parent and child)."""
    import tempfile

    files = {
        "lib.rs": "mod a;\nmod b;\nmod c;\nmod d;\nmod e;\npub use a::Thing;\n",
        # a -> b through the crate root's re-export of nothing: a names b directly.
        "a.rs": "use crate::b::Other;\npub struct Thing;\n// use crate::c::Gone;\n",
        # b -> a through the root's re-export (crate::Thing is a's).
        "b.rs": "pub struct Other(crate::Thing);\nconst S: &str = \"crate::d::X\";\n",
        "c.rs": "pub struct C;\n#[cfg(test)]\nmod tests {\n    use crate::d::D;\n}\n",
        "d/mod.rs": "mod inner;\npub use inner::D;\nuse super::c::C;\n",
        "d/inner.rs": "pub struct D(super::super::c::C);\n",
        # e <-> d via a group and an inline path: d::inner names e below.
        "e.rs": "use crate::{c::C, d::D};\npub struct E;\n",
    }
    files["d/inner.rs"] += "pub fn f() -> crate::e::E { crate::e::E }\n"
    with tempfile.TemporaryDirectory() as root:
        for name, body in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
            with open(os.path.join(root, name), "w") as fh:
                fh.write(body)
        edges = analyse(root)
    pairs = {(a, b) for (_, a, b) in edges}
    want = {(("a",), ("b",)), (("b",), ("a",)), (("d",), ("c",)), (("d",), ("e",)), (("e",), ("c",)), (("e",), ("d",))}
    if pairs != want:
        print(f"modcycles self-test: edges {sorted(pairs)}, expected {sorted(want)}")
        return 1
    print("modcycles self-test: the made-up crate's edges are found, and nothing else")
    return 0


def main():
    sys.setrecursionlimit(10000)
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    bad = 0
    for root in sys.argv[1:]:
        edges = analyse(root)
        by_parent = {}
        for (parent, a, b), where in edges.items():
            by_parent.setdefault(parent, {}).setdefault(a, {})[b] = where
        for parent, adj in sorted(by_parent.items()):
            nodes = set(adj) | {b for v in adj.values() for b in v}
            for comp in sccs(sorted(nodes), {a: sorted(bs) for a, bs in adj.items()}):
                if len(comp) < 2:
                    continue
                bad += 1
                name = lambda m: "::".join(m) or "crate"
                print(f"circle in {root} under {name(parent)}: " + ", ".join(sorted(name(c) for c in comp)))
                cs = set(comp)
                for a in sorted(cs):
                    for b, (f, line) in sorted(adj.get(a, {}).items()):
                        if b in cs:
                            print(f"    {name(a)} -> {name(b)}: {f}:{line}")
    if bad:
        print(f"modcycles: {bad} circle(s)")
        return 1
    print(f"modcycles: no import circle in {' '.join(sys.argv[1:])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
