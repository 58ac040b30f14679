#!/usr/bin/env python3
"""tests/cpu/check_exports.py — libfusedattn.so exports its public API and nothing else.

    python3 tests/cpu/check_exports.py --library build/libfusedattn.so --headers include/fusedattn [--nm nm]

The allow-list comes from the public headers, not from cmake/fusedattn.map, so the two are checked
against each other: every defined dynamic symbol (nm -DC --defined-only) must be one of
  - a function of namespace fusedattn, or a public member of one of its classes, declared in a
    header (friend functions count as the namespace's);
  - the typeinfo, typeinfo name or vtable of one of those classes;
and no symbol may name detail::, an anonymous namespace, or a fusedattn type that no header
declares (an internal overload of a public name). Every non-inline, non-template function the
headers declare must in turn be exported, so a map that falls behind the headers fails too.
Exit status 1 with every offence listed, 0 otherwise.
"""
import argparse
import re
import subprocess
import sys
from pathlib import Path

KEYWORDS = {"if", "for", "while", "return", "sizeof", "decltype", "static_assert", "noexcept", "alignof"}


def tokens_of(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"^\s*#[^\n]*", " ", text, flags=re.M)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    text = re.sub(r"'(\\.|[^'\\])*'", "''", text)
    return re.findall(r"[A-Za-z_]\w*|::|->|\S", text)


class Api:
    """What the headers declare in namespace fusedattn (internal sub-namespaces left out)."""

    def __init__(self):
        self.free = set()      # namespace functions (and friend functions)
        self.members = {}      # class -> public member names
        self.types = set()     # every type path declared, "Plan", "graph::CompiledGraph", ...
        self.required = {}     # "fusedattn::name" or "fusedattn::Class::name" -> header, for non-inline functions


def skip_balanced(tokens, i, open_, close):
    """Index after the token that closes tokens[i] (== open_)."""
    depth = 0
    while i < len(tokens):
        if tokens[i] == open_:
            depth += 1
        elif tokens[i] == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def function_name(statement):
    """The declared function's name in a statement's tokens, or None when it declares none."""
    depth = 0
    for i, token in enumerate(statement):
        if token == "operator":  # operator==, operator(), operator< ...: the name runs to its "("
            j = i + 1
            if statement[j:j + 2] == ["(", ")"]:
                return "operator()"
            while j < len(statement) and statement[j] != "(":
                j += 1
            return "operator" + "".join(statement[i + 1:j])
        if token == "<":
            depth += 1
        elif token == ">":
            depth -= 1
        elif token == "(" and depth == 0:
            k = i - 1
            if k >= 0 and statement[k] == ">":  # explicit template arguments: relative_error<double, double>(
                nesting = 0
                while k >= 0:
                    nesting += statement[k] == ">"
                    nesting -= statement[k] == "<"
                    k -= 1
                    if nesting == 0:
                        break
            if k >= 0 and re.fullmatch(r"[A-Za-z_]\w*", statement[k]) and statement[k] not in KEYWORDS:
                return ("~" + statement[k]) if k > 0 and statement[k - 1] == "~" else statement[k]
            return None
    return None


def parse_header(path, api):
    tokens = tokens_of(path.read_text())
    scopes = []  # {"kind": "namespace", "names": [...]} or {"kind": "class", "name", "access", "template"}
    statement, template = [], False

    def namespaces():
        return [name for scope in scopes if scope["kind"] == "namespace" for name in scope["names"]]

    def in_namespace_scope():  # directly in namespace fusedattn, not in a class or sub-namespace
        return namespaces() == ["fusedattn"] and scopes[-1]["kind"] == "namespace"

    def in_public_class():  # directly in the public part of a class of namespace fusedattn
        return (len(scopes) >= 2 and scopes[-1]["kind"] == "class" and scopes[-1]["access"] == "public"
                and scopes[-2]["kind"] == "namespace" and namespaces() == ["fusedattn"])

    def declare(statement, body):
        if not statement or statement[0] in ("using", "typedef", "static_assert") or not scopes:
            return
        name = function_name(statement)
        if not name:
            return
        inline = body or any(t in ("inline", "constexpr") for t in statement) or \
            statement[-2:] in (["=", "default"], ["=", "delete"], ["=", "0"])
        generic = template or any(scope["kind"] == "class" and scope["template"] for scope in scopes)
        required = not inline and not generic and "extern" not in statement
        in_class = scopes[-1]["kind"] == "class"
        if in_namespace_scope() or (in_class and "friend" in statement and namespaces() == ["fusedattn"]):
            api.free.add(name)
            if required:
                api.required.setdefault(f"fusedattn::{name}", path.name)
        elif in_public_class():
            cls = scopes[-1]["name"]
            api.members.setdefault(cls, set()).add(name)
            if required:
                api.required.setdefault(f"fusedattn::{cls}::{name}", path.name)

    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "template" and i + 1 < len(tokens) and tokens[i + 1] == "<":
            i = skip_balanced(tokens, i + 1, "<", ">")
            template = True
            continue
        if token == "namespace" and not statement:
            j, names = i + 1, []
            while tokens[j] != "{":
                if tokens[j] != "::":
                    names.append(tokens[j])
                j += 1
            scopes.append({"kind": "namespace", "names": names})
            i = j + 1
            continue
        if token in ("class", "struct", "union", "enum") and not statement:
            j = i + 1
            while tokens[j] in ("class", "struct"):
                j += 1
            name = tokens[j]
            k = j + 1
            while k < len(tokens) and tokens[k] not in ("{", ";"):
                k += 1
            if namespaces()[:1] == ["fusedattn"] and scopes[-1]["kind"] == "namespace":
                api.types.add("::".join(namespaces()[1:] + [name]))
            if tokens[k] == ";":  # a forward declaration
                i, template = k + 1, False
                continue
            if token == "enum":
                i = skip_balanced(tokens, k, "{", "}")
                while i < len(tokens) and tokens[i] != ";":
                    i += 1
                i, template = i + 1, False
                continue
            scopes.append({"kind": "class", "name": name, "access": "private" if token == "class" else "public",
                           "template": template})
            template = False
            i = k + 1
            continue
        if token in ("public", "private", "protected") and tokens[i + 1:i + 2] == [":"] and scopes \
                and scopes[-1]["kind"] == "class":
            scopes[-1]["access"] = token
            i += 2
            continue
        if token == ":" and scopes and scopes[-1]["kind"] == "class" and function_name(statement):
            while tokens[i] != "{":  # a constructor's initializer list: its body follows
                i += 1
            continue
        if token == "{" and statement.count("(") > statement.count(")"):  # a default argument: `= {}`
            end = skip_balanced(tokens, i, "{", "}")
            statement += tokens[i:end]
            i = end
            continue
        if token in ("{", ";"):
            declare(statement, body=token == "{")
            statement, template = [], False
            i = skip_balanced(tokens, i, "{", "}") if token == "{" else i + 1
            continue
        if token == "}":
            statement, template = [], False
            if scopes:
                scopes.pop()
            i += 1
            continue
        statement.append(token)
        i += 1


def split_symbol(symbol):
    """(qualified name parts, whole text) of a demangled function symbol; None for data symbols."""
    text = re.sub(r"\[abi:\w+\]", "", symbol)
    text = re.sub(r"operator\s*\(\)", "operator@call", text)
    text = re.sub(r"operator\s*([^\w\s(@]+)", lambda m: "operator@" + str(len(m.group(1))), text)
    depth = 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            head = text[:i]
            break
    else:
        head = text
    # drop a leading return type (templates): the name is the last top-level word
    depth, start = 0, 0
    for i, ch in enumerate(head):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == " " and depth == 0:
            start = i + 1
    name = head[start:]
    while "<" in name:  # template arguments
        name = re.sub(r"<[^<>]*>", "", name)
    return name.split("::")


def operator_name(part, symbol):
    if not part.startswith("operator@"):
        return part
    if part == "operator@call":
        return "operator()"
    found = re.search(r"operator\s*([^\w\s(]+)", symbol)
    return "operator" + found.group(1) if found else part


def unknown_type(text, api):
    """A fusedattn type that `text` names and no header declares, or None."""
    for referenced in re.findall(r"fusedattn::((?:\w+::)*\w+)", text):
        parts = referenced.split("::")
        if not any("::".join(parts[:n]) in api.types for n in range(1, len(parts) + 1)):
            return f"fusedattn::{referenced}"
    return None


def check_symbol(symbol, api):
    """The offence of one exported symbol, or None."""
    if "detail::" in symbol:
        return "names detail::"
    if "(anonymous namespace)" in symbol:
        return "is in an anonymous namespace"
    special = re.match(r"(typeinfo name for|typeinfo for|vtable for) (.*)$", symbol)
    if special:
        parts = special.group(2).split("::")
        if parts[0] == "fusedattn" and "::".join(parts[1:]) in api.types:
            return None
        return f"is the {special.group(1)[:-4]} of a type no public header declares"
    parts = [operator_name(p, symbol) for p in split_symbol(symbol)]
    if parts[0] != "fusedattn":
        return "is not in namespace fusedattn (an instantiation or a dependency's symbol)"
    # The types the symbol names besides its own name: an internal overload of a public name shows here.
    signature = symbol[symbol.find("("):] if "(" in symbol else ""
    stranger = unknown_type(signature, api)
    if stranger:
        return f"names {stranger}, which no public header declares"
    if len(parts) == 2 and parts[1] in api.free:
        return None
    if len(parts) == 3 and parts[1] in api.types:
        cls, member = parts[1], parts[2]
        if member in api.members.get(cls, set()) or member in (cls, "~" + cls, "operator="):
            return None
        return f"is not a public member of fusedattn::{cls} in the headers"
    return "is not declared in a public header"


def exported(nm, library):
    out = subprocess.run([nm, "-DC", "--defined-only", str(library)], check=True, capture_output=True, text=True).stdout
    symbols = []
    for line in out.splitlines():
        fields = line.split(None, 2)
        if len(fields) == 3:
            symbols.append((fields[1], fields[2]))
    return symbols


def problems(symbols, api):
    """Every offence of `symbols` ((nm kind, demangled name) pairs) against `api`, as text."""
    offences = []
    for kind, symbol in symbols:
        why = check_symbol(symbol, api)
        if why:
            offences.append(f"exported but not public API ({kind}): {symbol}\n    it {why}")
    names = set()
    for _, symbol in symbols:
        if not re.match(r"(typeinfo|vtable) ", symbol):
            names.add("::".join(operator_name(p, symbol) for p in split_symbol(symbol)))
    for name, header in sorted(api.required.items()):
        if name not in names:
            pattern = re.sub(r"[^\w:]", "?", name)  # ld's script syntax takes no parentheses or operators
            offences.append(f"declared in include/fusedattn/{header} but not exported: {name}\n"
                            f"    add `{pattern}[!_a-zA-Z0-9]*;` to cmake/fusedattn.map (or define it)")
    return offences


def public_api(headers):
    api = Api()
    for header in sorted(Path(headers).glob("*.h")):
        parse_header(header, api)
    return api


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", required=True, type=Path)
    parser.add_argument("--headers", required=True, type=Path)
    parser.add_argument("--nm", default="nm")
    args = parser.parse_args()
    api = public_api(args.headers)
    symbols = exported(args.nm, args.library)
    offences = problems(symbols, api)
    print(f"{args.library.name}: {len(symbols)} exported symbols; {len(api.free)} function names and "
          f"{len(api.types)} types in {args.headers}")
    for offence in offences:
        print(offence)
    print("FAIL" if offences else "PASS", f"({len(offences)} problems)")
    return 1 if offences else 0


if __name__ == "__main__":
    sys.exit(main())
