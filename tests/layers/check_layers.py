#!/usr/bin/env python3
"""The build's layering, checked on what was built.

Usage: check_layers.py NM LAYER=ARCHIVE=DEP,DEP ...

Each layer is a static library that may call into the layers it names
(and theirs, transitively), never into any other tfhost layer: for every
symbol an archive leaves undefined that another tfhost archive defines,
the defining archive must be one of its layers below. Within a library,
the source files must not call each other in a cycle either (a cycle means
two files that cannot be understood, tested or moved apart). Prints every
offending call or cycle and exits 1 if there is any; with none it prints
the layer order it saw.
"""
import subprocess
import sys


def object_name(line):
    """The member's name from nm -A's "archive.a:member.o:" prefix."""
    return line.split(":")[1]


def symbols(nm, archive):
    """(defined, uses): the archive's external symbols -> the object defining
    each, and object -> the symbols it leaves undefined."""
    out = subprocess.run([nm, "-A", "--defined-only", "-g", archive], capture_output=True, text=True, check=True)
    defined = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[-2] not in ("w", "v"):
            defined.setdefault(parts[-1], object_name(line))
    out = subprocess.run([nm, "-A", "--undefined-only", archive], capture_output=True, text=True, check=True)
    uses = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            uses.setdefault(object_name(line), set()).add(parts[-1])
    return defined, uses


def cycles(graph):
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    nm = argv[1]
    layers = {}
    for spec in argv[2:]:
        name, archive, deps = spec.split("=")
        layers[name] = (archive, [d for d in deps.split(",") if d])
    below = {}

    def closure(name):
        if name not in below:
            seen = set()
            for d in layers[name][1]:
                seen.add(d)
                seen |= closure(d)
            below[name] = seen
        return below[name]

    owner = {}
    defined = {}
    uses = {}
    for name, (archive, _) in layers.items():
        defined[name], uses[name] = symbols(nm, archive)
        for sym in defined[name]:
            owner.setdefault(sym, name)
    bad = []
    checked = 0
    for name in layers:
        allowed = closure(name)
        graph = {}
        for obj, syms in sorted(uses[name].items()):
            for sym in sorted(syms):
                checked += 1
                where = owner.get(sym)
                if where and where != name and where not in allowed:
                    bad.append(f"{name} ({obj}) calls {sym}, defined in {where}, which is not below it")
                inner = defined[name].get(sym) if where == name else None
                if inner and inner != obj:
                    graph.setdefault(obj, set()).add(inner)
        for comp in cycles(graph):
            bad.append(f"{name}: these files call each other in a cycle: {', '.join(comp)}")
    if bad:
        print("layering: %d problem%s:" % (len(bad), "" if len(bad) == 1 else "s"))
        for line in bad:
            print("  " + line)
        return 1
    order = sorted(layers, key=lambda n: len(closure(n)))
    print("layering: %d libraries, %d references checked, no upward call, no cycle; bottom to top: %s"
          % (len(layers), checked, " < ".join(order)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
